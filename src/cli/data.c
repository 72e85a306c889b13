/* loom data: prepare data sets (the KJV text), describe data files, write
 * llm.c token shards, measure the loader. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loom/data.h"

static int fail(const char *cmd) {
  fprintf(stderr, "loom data %s: %s\n", cmd, loom_last_error());
  return LOOM_EXIT_FAIL;
}

/* "loom data CMD: WHAT 'ARG'" and a pointer to the help. */
static int usage_error(const char *cmd, const char *what, const char *arg) {
  fprintf(stderr, "loom data %s: %s '%s'\n", cmd, what, arg);
  fprintf(stderr, "'loom data %s --help' lists the options.\n", cmd);
  return LOOM_EXIT_USAGE;
}

/* "loom data CMD: OPT needs an integer in [LO, HI], not 'ARG'" (exit 2). */
static int range_error(const char *cmd, const char *opt, const char *arg,
                       int64_t lo, int64_t hi) {
  char what[128];
  snprintf(what, sizeof what, "%s needs an integer in [%lld, %lld], not", opt,
           (long long)lo, (long long)hi);
  return usage_error(cmd, what, arg);
}

static bool is_help(const char *a) {
  return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* Parses an integer option value in [lo, hi]; false on junk, on a value
 * out of range, and on one too large for int64 (not clamped). */
static bool parse_int_in(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!s[0] || *end || errno == ERANGE || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

/* ------------------------------------------------------------------ kjv */

static void kjv_help(FILE *f) {
  fprintf(
      f,
      "usage: loom data kjv [--out PATH] [--force] [--no-verify] "
      "[--bible PROGRAM]\n\n"
      "Writes the King James Bible as plain text for the byte-level "
      "data set:\n"
      "runs 'bible -f -l100000 -m 8192 Gen1:1-Rev22:21' (Debian "
      "packages %s),\n"
      "drops the verse reference at the start of each line and keeps "
      "one verse\n"
      "per line: %d verses, %d bytes of ASCII. A file already there "
      "with the\n"
      "right size and CRC32C is reused.\n\n"
      "  --out PATH       where to write it (default $LOOM_DATA_DIR/kjv.txt, "
      "else data/kjv.txt)\n"
      "  --force          prepare it again even when the cached file is "
      "valid\n"
      "  --no-verify      accept a text whose verse count, size or "
      "checksum differ\n"
      "  --bible PROGRAM  the bible program to run (default: bible on "
      "PATH)\n",
      LOOM_KJV_PACKAGES, LOOM_KJV_VERSES, LOOM_KJV_BYTES);
}

static int cmd_kjv(int argc, char **argv) {
  loom_kjv_opts o = loom_kjv_opts_default();
  const char *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (is_help(argv[i])) {
      kjv_help(stdout);
      return LOOM_EXIT_OK;
    } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else if (strcmp(argv[i], "--bible") == 0 && i + 1 < argc) {
      o.program = argv[++i];
    } else if (strcmp(argv[i], "--force") == 0) {
      o.force = true;
    } else if (strcmp(argv[i], "--no-verify") == 0) {
      o.verify = false;
    } else {
      return usage_error("kjv", "unknown or incomplete option", argv[i]);
    }
  }
  char path[4096];
  if (!out) {
    if (loom_kjv_default_path(path, sizeof path) != LOOM_OK)
      return fail("kjv");
    out = path;
  }
  loom_kjv_info info;
  double t0 = loom_time_now();
  if (loom_kjv_prepare(out, &o, &info) != LOOM_OK)
    return fail("kjv");
  if (info.cached)
    printf("%s: %lld bytes, CRC32C %08x (cached, valid)\n", out,
           (long long)info.bytes, info.crc32c);
  else
    printf("%s: %lld verses, %lld bytes, CRC32C %08x (prepared in %.2f s)\n",
           out, (long long)info.verses, (long long)info.bytes, info.crc32c,
           loom_time_now() - t0);
  return LOOM_EXIT_OK;
}

/* ----------------------------------------------------------------- info */

static void info_help(FILE *f) {
  fprintf(f, "usage: loom data info PATH [--context T]\n\n"
             "Describes a data file: an IDX file (gzip or plain), an llm.c "
             "token shard\n"
             "(.bin), or a text file read as bytes (with its train/val split "
             "and the\n"
             "number of windows of T+1 bytes; T in [1, 2^24], default 128).\n"
             "The kind comes from the file's first bytes (gzip, IDX or shard "
             "magic;\n"
             "else text), not its name.\n");
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The reader a data file goes to, as `loom data info` and `loom data bench`
 * choose it. The content decides; a name that promises a shard or an IDX
 * file whose content has neither magic goes to that reader for its error
 * (wrong magic), not to the text reader. */
static loom_status data_file_kind(const char *path, loom_data_file *kind) {
  LOOM_TRY(loom_data_file_detect(path, kind));
  if (*kind == LOOM_DATA_FILE_TEXT && ends_with(path, ".bin"))
    *kind = LOOM_DATA_FILE_SHARD;
  else if (*kind == LOOM_DATA_FILE_TEXT &&
           (ends_with(path, ".gz") || ends_with(path, "-ubyte")))
    *kind = LOOM_DATA_FILE_IDX;
  return LOOM_OK;
}

static int cmd_info(int argc, char **argv) {
  const char *path = NULL;
  int64_t T = 128;
  for (int i = 1; i < argc; i++) {
    if (is_help(argv[i])) {
      info_help(stdout);
      return LOOM_EXIT_OK;
    } else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
      if (!parse_int_in(argv[++i], 1, LOOM_TEXT_MAX_CONTEXT, &T))
        return range_error("info", "--context", argv[i], 1,
                           LOOM_TEXT_MAX_CONTEXT);
    } else if (argv[i][0] == '-' || path) {
      return usage_error("info", "unexpected argument", argv[i]);
    } else {
      path = argv[i];
    }
  }
  if (!path) {
    info_help(stderr);
    return LOOM_EXIT_USAGE;
  }
  loom_data_file kind;
  if (data_file_kind(path, &kind) != LOOM_OK)
    return fail("info");
  if (kind == LOOM_DATA_FILE_SHARD) {
    loom_shard s;
    if (loom_shard_open(path, &s) != LOOM_OK)
      return fail("info");
    printf("%s: llm.c token shard, magic %d version %d, %lld tokens of %d "
           "bytes, largest id %u\n",
           path, s.magic, s.version, (long long)s.ntok, s.width, s.max_token);
    loom_shard_close(&s);
    return LOOM_EXIT_OK;
  }
  if (kind == LOOM_DATA_FILE_IDX) {
    loom_idx m;
    if (loom_idx_read(path, &m) != LOOM_OK)
      return fail("info");
    printf("%s: IDX, unsigned bytes, %d dimensions (", path, m.ndim);
    for (int i = 0; i < m.ndim; i++)
      printf("%s%lld", i ? ", " : "", (long long)m.dims[i]);
    printf(")\n");
    loom_idx_free(&m);
    return LOOM_EXIT_OK;
  }
  loom_text_opts o = loom_text_opts_default();
  o.context = T;
  for (int s = 0; s < LOOM_SPLIT_COUNT; s++) {
    loom_dataset *ds = NULL;
    if (loom_dataset_open_text(&ds, path, (loom_split)s, &o) != LOOM_OK)
      return fail("info");
    loom_dataset_info di;
    loom_dataset_get_info(ds, &di);
    printf("%s: text, %s split: %lld bytes, %lld windows of %lld+1, largest "
           "byte %lld\n",
           path, loom_split_name((loom_split)s), (long long)di.tokens,
           (long long)di.len, (long long)T, (long long)di.classes - 1);
    loom_dataset_free(ds);
  }
  return LOOM_EXIT_OK;
}

/* ---------------------------------------------------------------- shard */

static void shard_help(FILE *f) {
  fprintf(f,
          "usage: loom data shard IN OUT.bin\n\n"
          "Writes the bytes of IN as an llm.c token shard (magic %d, "
          "version %d,\n"
          "uint16 tokens, one per byte), so byte-level text can go through "
          "the\n"
          "shard reader or to llm.c. OUT must not be IN (the same file by\n"
          "any name: exit 2); its directory must exist (exit 1 when not).\n",
          LOOM_SHARD_MAGIC_U16, LOOM_SHARD_VERSION_U16);
}

static int cmd_shard(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (is_help(argv[i])) {
      shard_help(stdout);
      return LOOM_EXIT_OK;
    } else if (argv[i][0] == '-' || (in && out)) {
      return usage_error("shard", "unexpected argument", argv[i]);
    } else if (!in) {
      in = argv[i];
    } else {
      out = argv[i];
    }
  }
  if (!in || !out) {
    shard_help(stderr);
    return LOOM_EXIT_USAGE;
  }
  /* OUT replaces the file it names: when that is IN (the same name, a hard
   * link, or a symbolic link to it), the text would be lost. */
  struct stat si, so;
  if (stat(in, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev &&
      si.st_ino == so.st_ino) {
    fprintf(stderr,
            "loom data shard: %s is the same file as %s: writing the shard "
            "there would destroy the input; name another OUT\n",
            out, in);
    return LOOM_EXIT_USAGE;
  }
  /* OUT's directory must be there: a mistyped path is an error naming it,
   * not a tree of new directories (loom_shard_write would create them). */
  char parent[4096];
  const char *slash = strrchr(out, '/');
  int pn = !slash         ? snprintf(parent, sizeof parent, ".")
           : slash == out ? snprintf(parent, sizeof parent, "/")
                          : snprintf(parent, sizeof parent, "%.*s",
                                     (int)(slash - out), out);
  struct stat sp;
  if (pn > 0 && (size_t)pn < sizeof parent) {
    int r = stat(parent, &sp);
    if (r != 0 && errno == ENOENT) {
      loom_error(LOOM_ERR_IO,
                 "%s: its directory %s does not exist (loom data shard "
                 "creates no directories)",
                 out, parent);
      return fail("shard");
    }
    if ((r != 0 && errno == ENOTDIR) || (r == 0 && !S_ISDIR(sp.st_mode))) {
      loom_error(LOOM_ERR_IO, "%s: %s is not a directory", out, parent);
      return fail("shard");
    }
  }
  /* The input is read and written a block at a time (memory does not grow
   * with it); a FIFO, a directory or a missing file is an error naming it
   * and why, never a hang or an empty shard. */
  int64_t n = 0;
  loom_cli_discard_on_stop(); /* Ctrl-C leaves no hidden temporary */
  if (loom_shard_write_bytes(out, in, &n) != LOOM_OK)
    return fail("shard");
  /* and the temporaries of earlier runs killed outright (SIGKILL) */
  if (pn > 0 && (size_t)pn < sizeof parent)
    (void)loom_fs_remove_dead_tmps(parent, slash ? slash + 1 : out);
  printf("%s: %lld tokens\n", out, (long long)n);
  return LOOM_EXIT_OK;
}

/* ---------------------------------------------------------------- bench */

static void bench_help(FILE *f) {
  fprintf(f,
          "usage: loom data bench [--data fashion|kjv] [--path P] [--batch B] "
          "[--batches N] [--prefetch K] [--compute MS]\n\n"
          "Measures the loader: batches made per second with no thread "
          "(prefetch 0),\n"
          "then the time a step waits for data when each step computes for "
          "MS\n"
          "milliseconds (default 2; fractions allowed, in [0, 60000]) with K "
          "batches\n"
          "prefetched (default 2, in [0, %d]).\n"
          "Defaults: fashion (Fashion-MNIST train, batch 128) or kjv "
          "(data/kjv.txt,\n"
          "batch 32 x 128 bytes); N = 200 batches; B and N in [1, 2^30].\n"
          "With kjv, P may also be an llm.c token shard (.bin), read by the "
          "shard\n"
          "reader as in 'loom data info'.\n",
          LOOM_LOADER_MAX_PREFETCH);
}

/* Upper bounds of bench's options: sanity, not capacity (the sampler takes
 * batches up to 2^40). */
#define BENCH_MAX_COUNT ((int64_t)1 << 30)
#define BENCH_MAX_COMPUTE_MS 60000.0

static void spin_for(double seconds) {
  double end = loom_time_now() + seconds;
  volatile double x = 0;
  while (loom_time_now() < end)
    x = x + 1.0;
}

static int cmd_bench(int argc, char **argv) {
  const char *data = "fashion", *path = NULL;
  int64_t batch = 0, batches = 200, prefetch = 2;
  double compute_ms = 2;
  for (int i = 1; i < argc; i++) {
    if (is_help(argv[i])) {
      bench_help(stdout);
      return LOOM_EXIT_OK;
    }
    const char *o = argv[i];
    if (strcmp(o, "--data") != 0 && strcmp(o, "--path") != 0 &&
        strcmp(o, "--batch") != 0 && strcmp(o, "--batches") != 0 &&
        strcmp(o, "--prefetch") != 0 && strcmp(o, "--compute") != 0)
      return usage_error("bench", "unknown option", o);
    if (i + 1 >= argc)
      return usage_error("bench", "a value is missing after", o);
    const char *v = argv[++i];
    if (strcmp(o, "--data") == 0) {
      data = v;
    } else if (strcmp(o, "--path") == 0) {
      path = v;
    } else if (strcmp(o, "--batch") == 0) {
      if (!parse_int_in(v, 1, BENCH_MAX_COUNT, &batch))
        return range_error("bench", o, v, 1, BENCH_MAX_COUNT);
    } else if (strcmp(o, "--batches") == 0) {
      if (!parse_int_in(v, 1, BENCH_MAX_COUNT, &batches))
        return range_error("bench", o, v, 1, BENCH_MAX_COUNT);
    } else if (strcmp(o, "--prefetch") == 0) {
      if (!parse_int_in(v, 0, LOOM_LOADER_MAX_PREFETCH, &prefetch))
        return range_error("bench", o, v, 0, LOOM_LOADER_MAX_PREFETCH);
    } else {
      char *end = NULL;
      errno = 0;
      compute_ms = strtod(v, &end);
      if (!v[0] || *end || errno == ERANGE || !(compute_ms >= 0) ||
          compute_ms > BENCH_MAX_COMPUTE_MS)
        return usage_error("bench",
                           "--compute needs milliseconds in [0, "
                           "60000] (fractions allowed), not",
                           v);
    }
  }
  loom_dataset *ds = NULL;
  loom_status st;
  char kjv[4096];
  if (strcmp(data, "fashion") == 0) {
    st = loom_dataset_open_fashion(&ds, path, LOOM_SPLIT_TRAIN, NULL);
    if (!batch)
      batch = 128;
  } else if (strcmp(data, "kjv") == 0) {
    if (!path) {
      if (loom_kjv_prepare(NULL, NULL, NULL) != LOOM_OK ||
          loom_kjv_default_path(kjv, sizeof kjv) != LOOM_OK)
        return fail("bench");
      path = kjv;
    }
    /* A token shard goes to the shard reader, as in `loom data info`;
     * read as text, a damaged shard was "benchmarked". */
    loom_data_file kind;
    if (data_file_kind(path, &kind) != LOOM_OK)
      return fail("bench");
    if (kind == LOOM_DATA_FILE_IDX) {
      loom_error(LOOM_ERR_INVALID_ARG,
                 "%s: an IDX file, not text or a token shard (--data fashion "
                 "reads IDX files from a directory)",
                 path);
      return fail("bench");
    }
    st = kind == LOOM_DATA_FILE_SHARD
             ? loom_dataset_open_shards(&ds, path, NULL)
             : loom_dataset_open_text(&ds, path, LOOM_SPLIT_TRAIN, NULL);
    if (!batch)
      batch = 32;
  } else {
    return usage_error("bench", "unknown data set (fashion or kjv):", data);
  }
  if (st != LOOM_OK)
    return fail("bench");
  int rc = LOOM_EXIT_OK;
  for (int pass = 0; pass < 2 && rc == LOOM_EXIT_OK; pass++) {
    loom_loader_opts lo = loom_loader_opts_default();
    lo.sampler.batch = batch;
    lo.sampler.tail = LOOM_TAIL_PAD;
    lo.sampler.seed = 1;
    lo.prefetch = pass == 0 ? 0 : (int)prefetch;
    loom_loader *l = NULL;
    if (loom_loader_new(&l, ds, &lo) != LOOM_OK) {
      rc = fail("bench");
      break;
    }
    double t0 = loom_time_now();
    for (int64_t b = 0; b < batches; b++) {
      const loom_batch *bt;
      if (loom_loader_next(l, &bt) != LOOM_OK) {
        rc = fail("bench");
        break;
      }
      if (pass == 1)
        spin_for(compute_ms * 1e-3);
    }
    double dt = loom_time_now() - t0;
    if (rc == LOOM_EXIT_OK) {
      if (pass == 0)
        printf("%s: batch %lld, no thread: %.0f batches/s, %.0f samples/s "
               "(%.3f ms per batch)\n",
               data, (long long)batch, (double)batches / dt,
               (double)(batches * batch) / dt, 1e3 * dt / (double)batches);
      else
        printf("%s: batch %lld, prefetch %lld, %g ms compute per step: "
               "data wait %.4f ms per step (%.2f%% of the step)\n",
               data, (long long)batch, (long long)prefetch, compute_ms,
               1e3 * loom_loader_wait_total(l) / (double)batches,
               100.0 * loom_loader_wait_total(l) / dt);
    }
    loom_loader_free(l);
  }
  loom_dataset_free(ds);
  return rc;
}

/* ------------------------------------------------------------- dispatch */

static const struct {
  const char *name;
  loom_cli_fn fn;
  const char *help;
} subcommands[] = {
    {"kjv", cmd_kjv, "prepare the King James Bible text (data/kjv.txt)"},
    {"info", cmd_info, "describe an IDX file, token shard or text file"},
    {"shard", cmd_shard, "write a file's bytes as an llm.c token shard"},
    {"bench", cmd_bench, "measure batch making and data wait"},
};

int loom_cmd_data(int argc, char **argv) {
  if (argc < 2 || is_help(argv[1])) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: loom data <what> [options]\n\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
      fprintf(f, "  %-6s %s\n", subcommands[i].name, subcommands[i].help);
    fprintf(f, "\n'loom data <what> --help' lists its options.\n");
    return argc < 2 ? LOOM_EXIT_USAGE : LOOM_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
    if (strcmp(argv[1], subcommands[i].name) == 0)
      return subcommands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "loom data: unknown subcommand '%s'\n", argv[1]);
  return LOOM_EXIT_USAGE;
}
