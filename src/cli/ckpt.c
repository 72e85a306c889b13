/* loom ckpt: inspect and verify checkpoints (docs/checkpoints.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "loom/ckpt.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: loom ckpt inspect DIR [--no-verify] [--json]\n"
          "       loom ckpt verify DIR\n"
          "\n"
          "DIR is a checkpoint (RUN/ckpt/step_00000500), the `latest` file "
          "of a\n"
          "checkpoint directory, or the directory itself (RUN/ckpt).\n"
          "\n"
          "  inspect      what a checkpoint holds: step, world size, "
          "strategy,\n"
          "               buffers, parameters, optimizer, data position, "
          "RNG\n"
          "               streams, and each shard file checked (OK or BAD).\n"
          "               On a directory of checkpoints: the list, then the "
          "one\n"
          "               training would resume from.\n"
          "  --no-verify  check sizes and headers only, not every checksum\n"
          "  --json       print manifest.json as stored\n"
          "  verify       check every checksum of a checkpoint, or of every\n"
          "               checkpoint in a directory and its `latest` "
          "pointer\n"
          "\n"
          "Exit status: 0 when everything checked is OK; 1 when anything "
          "checked is\n"
          "damaged (a shard, a manifest, a checkpoint in the list, the "
          "`latest`\n"
          "pointer) or a directory holds no checkpoint; 2 on a usage "
          "error.\n");
}

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_manifest(const char *dir) {
  char p[4200];
  int w = snprintf(p, sizeof p, "%s/manifest.json", dir);
  struct stat st;
  return w > 0 && (size_t)w < sizeof p && stat(p, &st) == 0;
}

/* A checkpoint (as opposed to a directory of them), even when damaged. */
static bool is_checkpoint(const char *dir) {
  if (has_manifest(dir) || !is_dir(dir))
    return true;
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/')
    n--;
  size_t b = n;
  while (b > 0 && dir[b - 1] != '/')
    b--;
  if (n - b > 5 && strncmp(dir + b, "step_", 5) == 0 &&
      strspn(dir + b + 5, "0123456789") == n - b - 5)
    return true;
  char p[4200];
  int w = snprintf(p, sizeof p, "%s/shard_00000.bin", dir);
  struct stat st;
  return w > 0 && (size_t)w < sizeof p && stat(p, &st) == 0;
}

/* "RUN/ckpt/latest" names the checkpoint it points at. */
static bool resolve_latest_file(const char *arg, char *out, size_t n) {
  const char *slash = strrchr(arg, '/');
  const char *base = slash ? slash + 1 : arg;
  if (strcmp(base, "latest") != 0 || is_dir(arg))
    return false;
  char root[4096];
  if (slash)
    snprintf(root, sizeof root, "%.*s", (int)(slash - arg), arg);
  else
    snprintf(root, sizeof root, ".");
  int64_t step;
  if (loom_ckpt_read_latest(root, &step) != LOOM_OK) {
    fprintf(stderr, "loom ckpt: %s\n", loom_last_error());
    out[0] = '\0';
    return true;
  }
  loom_ckpt_dir_name(root, step, out, n);
  return true;
}

static void human_bytes(char *buf, size_t n, double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* Every shard file checked; returns the number that are damaged. */
static int check_files(const loom_ckpt *c, loom_ckpt_verify_level level,
                       bool print) {
  int bad = 0;
  if (print)
    printf("\nfiles (%s)\n", level == LOOM_CKPT_VERIFY_FULL
                                 ? "every checksum checked"
                                 : "sizes and headers checked");
  for (int i = 0; i < loom_ckpt_file_count(c); i++) {
    loom_ckpt_file_info fi;
    loom_ckpt_file_get(c, i, &fi);
    loom_status st = loom_ckpt_verify_file(c, i, level);
    char sz[32];
    human_bytes(sz, sizeof sz, (double)fi.bytes);
    if (print || st != LOOM_OK)
      printf("  %-16s rank %-5d %12s %6d blocks  index 0x%08x  %s%s\n", fi.name,
             fi.rank, sz, fi.n_blocks, fi.index_crc,
             st == LOOM_OK ? "OK" : "BAD: ",
             st == LOOM_OK ? "" : loom_last_error());
    bad += st != LOOM_OK;
  }
  return bad;
}

static void print_shape(char *buf, size_t n, const loom_param *v) {
  size_t o = 0;
  buf[0] = '\0';
  if (v->ndim == 0)
    snprintf(buf, n, "scalar");
  for (int d = 0; d < v->ndim && o < n; d++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? "x" : "",
                          (long long)v->shape[d]);
}

static int inspect_one(const char *dir, bool verify, bool json) {
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.verify = LOOM_CKPT_VERIFY_NONE; /* show it even when a shard is bad */
  loom_ckpt *c = NULL;
  if (loom_ckpt_open(&c, dir, &oo) != LOOM_OK) {
    fprintf(stderr, "loom ckpt: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  if (json) {
    fputs(loom_ckpt_manifest_text(c), stdout);
    loom_ckpt_close(c);
    return LOOM_EXIT_OK;
  }
  const loom_ckpt_meta *m = loom_ckpt_get_meta(c);
  char created[64] = "?", version[32] = "?";
  cJSON *root = cJSON_Parse(loom_ckpt_manifest_text(c));
  if (root) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "created");
    if (cJSON_IsString(x))
      snprintf(created, sizeof created, "%s", x->valuestring);
    x = cJSON_GetObjectItemCaseSensitive(root, "loom_version");
    if (cJSON_IsString(x))
      snprintf(version, sizeof version, "%s", x->valuestring);
    cJSON_Delete(root);
  }
  printf("checkpoint   %s\n", loom_ckpt_path(c));
  printf("step         %lld\n", (long long)m->step);
  printf("written      %s by loom %s\n", created, version);
  printf("world size   %d (strategy %s)\n", m->world_size,
         m->strategy[0] ? m->strategy : "-");
  printf("optimizer    %s, step %lld\n", m->optimizer[0] ? m->optimizer : "-",
         (long long)m->optimizer_step);
  printf("schedule     %s, step %lld, lr %.6g\n",
         m->schedule[0] ? m->schedule : "-", (long long)m->schedule_step,
         m->lr);
  printf("loss scale   %.6g\n", m->loss_scale);
  printf("data         epoch %lld, batch %lld, sample %lld\n",
         (long long)m->data.epoch, (long long)m->data.batch,
         (long long)m->data.sample);
  printf("hashes       config 0x%016llx, layout 0x%016llx\n",
         (unsigned long long)m->config_hash,
         (unsigned long long)m->layout_hash);
  for (int i = 0; i < m->n_rngs; i++)
    printf("%-12s %s: seed 0x%llx, stream 0x%llx, counter %llu\n",
           i ? "" : "rng", m->rngs[i].name,
           (unsigned long long)m->rngs[i].state.seed,
           (unsigned long long)m->rngs[i].state.stream,
           (unsigned long long)m->rngs[i].state.counter);
  printf("\nbuffers\n  %-24s %-5s %12s %12s %6s %7s\n", "name", "dtype",
         "elements", "bytes", "shards", "blocks");
  double total = 0;
  for (int i = 0; i < loom_ckpt_buffer_count(c); i++) {
    loom_ckpt_buffer_info b;
    loom_ckpt_buffer_get(c, i, &b);
    double bytes = (double)b.count * (double)loom_dtype_size(b.dtype);
    char sz[32];
    human_bytes(sz, sizeof sz, bytes);
    total += bytes;
    printf("  %-24s %-5s %12lld %12s %6d %7d\n", b.name,
           loom_dtype_name(b.dtype), (long long)b.count, sz, b.n_shards,
           b.n_blocks);
  }
  char tsz[32];
  human_bytes(tsz, sizeof tsz, total);
  printf("  %-24s %-5s %12s %12s\n", "total", "", "", tsz);
  int64_t numel = 0;
  for (int i = 0; i < m->n_views; i++)
    numel += m->views[i].numel;
  printf("\nparameters (%d views, %lld elements)\n", m->n_views,
         (long long)numel);
  if (m->n_views)
    printf("  %-40s %-16s %12s %10s %s\n", "name", "shape", "offset", "numel",
           "decay");
  for (int i = 0; i < m->n_views; i++) {
    char shape[64];
    print_shape(shape, sizeof shape, &m->views[i]);
    printf("  %-40s %-16s %12lld %10lld %s\n", m->views[i].name, shape,
           (long long)m->views[i].offset, (long long)m->views[i].numel,
           m->views[i].decay ? "yes" : "no");
  }
  if (strcmp(m->extra_json, "{}") != 0)
    printf("\nextra        %s\n", m->extra_json);
  int bad = check_files(
      c, verify ? LOOM_CKPT_VERIFY_FULL : LOOM_CKPT_VERIFY_META, true);
  loom_ckpt_close(c);
  if (bad)
    printf("\n%d damaged file%s\n", bad, bad == 1 ? "" : "s");
  return bad ? LOOM_EXIT_FAIL : LOOM_EXIT_OK;
}

/* A directory of checkpoints: the list, each checked; returns the number
 * of damaged ones (the `latest` pointer counts as one when broken), and in
 * *count the number of checkpoints listed. */
static int scan_root(const char *root, loom_ckpt_verify_level level,
                     int *count) {
  int64_t *steps = NULL, latest = -1;
  int n = 0, bad = 0;
  *count = 0;
  if (loom_ckpt_list(root, &steps, &n) != LOOM_OK) {
    fprintf(stderr, "loom ckpt: %s\n", loom_last_error());
    return 1;
  }
  *count = n;
  char lp[4200];
  struct stat lst;
  int w = snprintf(lp, sizeof lp, "%s/latest", root);
  bool latest_exists = w > 0 && (size_t)w < sizeof lp && stat(lp, &lst) == 0;
  if (loom_ckpt_read_latest(root, &latest) != LOOM_OK) {
    if (n > 0 || latest_exists) {
      printf("latest          BAD: %s\n", loom_last_error());
      bad++;
    }
    latest = -1;
  } else {
    bool found = false;
    for (int i = 0; i < n; i++)
      found |= steps[i] == latest;
    printf("latest          step_%08lld%s\n", (long long)latest,
           found ? "" : "  BAD: no such checkpoint");
    bad += !found;
  }
  for (int i = n - 1; i >= 0; i--) {
    char dir[4200];
    loom_ckpt_dir_name(root, steps[i], dir, sizeof dir);
    loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
    oo.verify = level;
    loom_ckpt *c = NULL;
    loom_status st = loom_ckpt_open(&c, dir, &oo);
    if (st == LOOM_OK && loom_ckpt_get_meta(c)->step != steps[i])
      /* as training's search for the newest valid checkpoint says it */
      st = loom_error(LOOM_ERR_CORRUPT, "%s: says step %lld, not %lld",
                      loom_ckpt_manifest_path(c),
                      (long long)loom_ckpt_get_meta(c)->step,
                      (long long)steps[i]);
    char sz[32] = "";
    if (c) {
      double bytes = 0;
      for (int f = 0; f < loom_ckpt_file_count(c); f++) {
        loom_ckpt_file_info fi;
        loom_ckpt_file_get(c, f, &fi);
        bytes += (double)fi.bytes;
      }
      human_bytes(sz, sizeof sz, bytes);
    }
    printf(
        "step_%08lld   %-12s %s%s%s\n", (long long)steps[i], sz,
        st == LOOM_OK ? "OK" : "BAD: ", st == LOOM_OK ? "" : loom_last_error(),
        steps[i] > latest && latest >= 0 ? "  (newer than latest: not "
                                           "committed)"
                                         : "");
    bad += st != LOOM_OK;
    loom_ckpt_close(c);
  }
  if (n == 0)
    printf("no checkpoints in %s: nothing to check\n", root);
  loom_free(steps);
  return bad;
}

/* A run directory (log.run_dir) holds its checkpoints in ckpt/ (the
 * default checkpoint.dir): given one, look there. Returns arg or buf. */
static const char *run_ckpt_dir(const char *arg, char *buf, size_t n) {
  struct stat st;
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/latest", arg);
  if (is_checkpoint(arg) || lstat(probe, &st) == 0)
    return arg;
  if (loom_ckpt_has_step_dirs(arg))
    return arg;
  snprintf(buf, n, "%s/ckpt", arg);
  if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
    return buf;
  return arg;
}

static int cmd_inspect(const char *arg, bool verify, bool json) {
  char dir[4200], runck[4200];
  arg = run_ckpt_dir(arg, runck, sizeof runck);
  if (resolve_latest_file(arg, dir, sizeof dir))
    return dir[0] ? inspect_one(dir, verify, json) : LOOM_EXIT_FAIL;
  if (is_checkpoint(arg))
    return inspect_one(arg, verify, json);
  /* A directory of checkpoints: exit 1 when anything listed is damaged
   * (as verify would say, at the level checked) or none is there, even
   * when an older checkpoint is fine to resume from. */
  int bad = 0, n = 0;
  if (!json) {
    printf("checkpoints in %s\n", arg);
    bad = scan_root(arg, verify ? LOOM_CKPT_VERIFY_FULL : LOOM_CKPT_VERIFY_META,
                    &n);
    printf("\n");
  }
  /* The one `loom train --resume auto` would take (it checks in full). */
  loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
  oo.verify = verify ? LOOM_CKPT_VERIFY_FULL : LOOM_CKPT_VERIFY_META;
  loom_ckpt *c = NULL;
  if (loom_ckpt_open_latest_valid(&c, arg, &oo) != LOOM_OK) {
    fprintf(stderr, "loom ckpt: %s\n", loom_last_error());
    return LOOM_EXIT_FAIL;
  }
  if (!c) {
    if (json)
      fprintf(stderr, "loom ckpt: no checkpoint in %s\n", arg);
    return LOOM_EXIT_FAIL;
  }
  snprintf(dir, sizeof dir, "%s", loom_ckpt_path(c));
  loom_ckpt_close(c);
  if (!json)
    printf("training resumes from:\n");
  int rc = inspect_one(dir, verify, json);
  return bad ? LOOM_EXIT_FAIL : rc;
}

static int cmd_verify(const char *arg) {
  char dir[4200], runck[4200];
  arg = run_ckpt_dir(arg, runck, sizeof runck);
  if (resolve_latest_file(arg, dir, sizeof dir)) {
    if (!dir[0])
      return LOOM_EXIT_FAIL;
    arg = dir;
  }
  if (is_checkpoint(arg)) {
    loom_ckpt_open_opts oo = loom_ckpt_open_opts_default();
    oo.verify = LOOM_CKPT_VERIFY_NONE;
    loom_ckpt *c = NULL;
    if (loom_ckpt_open(&c, arg, &oo) != LOOM_OK) {
      printf("%s: BAD: %s\n", arg, loom_last_error());
      return LOOM_EXIT_FAIL;
    }
    int bad = check_files(c, LOOM_CKPT_VERIFY_FULL, false);
    printf("%s: %s\n", loom_ckpt_path(c), bad ? "BAD" : "OK");
    loom_ckpt_close(c);
    return bad ? LOOM_EXIT_FAIL : LOOM_EXIT_OK;
  }
  int n = 0;
  int bad = scan_root(arg, LOOM_CKPT_VERIFY_FULL, &n);
  if (bad)
    printf("%d damaged\n", bad);
  /* Nothing verified is not "all good": a script that checks a run's
   * checkpoints before trusting them must not pass an empty directory. */
  return bad || n == 0 ? LOOM_EXIT_FAIL : LOOM_EXIT_OK;
}

int loom_cmd_ckpt(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    usage(stdout);
    return LOOM_EXIT_OK;
  }
  bool verify = true, json = false;
  const char *dir = NULL;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return LOOM_EXIT_OK;
    } else if (!strcmp(argv[i], "--no-verify") && !strcmp(sub, "inspect")) {
      verify = false;
    } else if (!strcmp(argv[i], "--json") && !strcmp(sub, "inspect")) {
      json = true;
    } else if (argv[i][0] == '-' || dir) {
      fprintf(stderr, "loom ckpt %s: unexpected argument '%s'\n", sub, argv[i]);
      usage(stderr);
      return LOOM_EXIT_USAGE;
    } else {
      dir = argv[i];
    }
  }
  if (!dir || (strcmp(sub, "inspect") != 0 && strcmp(sub, "verify") != 0)) {
    if (dir)
      fprintf(stderr, "loom ckpt: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return LOOM_EXIT_USAGE;
  }
  return !strcmp(sub, "inspect") ? cmd_inspect(dir, verify, json)
                                 : cmd_verify(dir);
}
