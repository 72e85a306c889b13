/* Runtime CPU features: CPUID, XGETBV (what the OS saves on a context
 * switch) and, for AMX, Linux's per-process permission for tile data; and
 * the choice of the instruction set whose copy of the kernels runs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/core.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* XCR0 bits: which register state the OS saves and restores. */
#define XCR0_SSE (1u << 1)
#define XCR0_AVX (1u << 2)
#define XCR0_OPMASK (1u << 5)
#define XCR0_ZMM_HI256 (1u << 6)
#define XCR0_HI16_ZMM (1u << 7)
#define XCR0_XTILECFG (1u << 17)
#define XCR0_XTILEDATA (1u << 18)

/* Linux arch_prctl codes (asm/prctl.h) for AMX tile data permission. */
#define LOOM_ARCH_GET_XCOMP_PERM 0x1022
#define LOOM_ARCH_REQ_XCOMP_PERM 0x1023
#define LOOM_XFEATURE_XTILEDATA 18

static uint64_t read_xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

/* Linux (5.16+) hands out AMX tile state only to processes that ask. */
static int amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
  unsigned long bits = 0;
  if (syscall(SYS_arch_prctl, LOOM_ARCH_GET_XCOMP_PERM, &bits) == 0 &&
      (bits & (1ul << LOOM_XFEATURE_XTILEDATA)))
    return 1;
  if (syscall(SYS_arch_prctl, LOOM_ARCH_REQ_XCOMP_PERM,
              (unsigned long)LOOM_XFEATURE_XTILEDATA) != 0)
    return 0;
  bits = 0;
  return syscall(SYS_arch_prctl, LOOM_ARCH_GET_XCOMP_PERM, &bits) == 0 &&
         (bits & (1ul << LOOM_XFEATURE_XTILEDATA));
#else
  return 0;
#endif
}

static void detect(loom_cpu_features *f) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return;
  const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
  const int f16c = (c >> 29) & 1;
  if (!osxsave || !avx)
    return; /* no OS-saved YMM state: nothing beyond SSE is usable */
  const uint64_t xcr0 = read_xcr0();
  const int ymm_ok = (xcr0 & (XCR0_SSE | XCR0_AVX)) == (XCR0_SSE | XCR0_AVX);
  const uint64_t zmm_bits = XCR0_OPMASK | XCR0_ZMM_HI256 | XCR0_HI16_ZMM;
  const int zmm_ok = ymm_ok && (xcr0 & zmm_bits) == zmm_bits;
  const uint64_t tile_bits = XCR0_XTILECFG | XCR0_XTILEDATA;
  const int tile_ok = (xcr0 & tile_bits) == tile_bits;
  f->fma = ymm_ok && fma;
  f->f16c = ymm_ok && f16c;
  unsigned max_leaf = __get_cpuid_max(0, NULL);
  if (max_leaf < 7)
    return;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned max_sub = a;
  f->avx2 = ymm_ok && ((b >> 5) & 1);
  f->avx512f = zmm_ok && ((b >> 16) & 1);
  f->avx512dq = f->avx512f && ((b >> 17) & 1);
  f->avx512bw = f->avx512f && ((b >> 30) & 1);
  f->avx512vl = f->avx512f && ((b >> 31) & 1);
  const int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1;
  f->avx512_fp16 = f->avx512bw && ((d >> 23) & 1);
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f->avx512_bf16 = f->avx512f && ((a >> 5) & 1);
  }
  if (amx_tile && tile_ok && amx_permitted()) {
    f->amx_tile = true;
    f->amx_bf16 = amx_bf16 != 0;
  }
}
#else
static void detect(loom_cpu_features *f) { (void)f; }
#endif

static loom_cpu_features g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect_once(void) { detect(&g_features); }

const loom_cpu_features *loom_cpu_get_features(void) {
  pthread_once(&g_once, detect_once);
  return &g_features;
}

static const char *const isa_names[] = {
#define LOOM_X_NAME(name, text) text,
    LOOM_ISA_LIST(LOOM_X_NAME)
#undef LOOM_X_NAME
};
_Static_assert(sizeof isa_names / sizeof isa_names[0] == LOOM_ISA_COUNT,
               "one name per instruction set");

const char *loom_isa_name(loom_isa isa) {
  if ((int)isa < 0 || isa >= LOOM_ISA_COUNT)
    return "unknown";
  return isa_names[isa];
}

/* Whether the copy for isa was built (LOOM_ISA_AVX2, LOOM_ISA_AVX512 in
 * CMakeLists.txt). */
static bool isa_built(loom_isa isa) {
  switch (isa) {
  case LOOM_ISA_BASE:
    return true;
  case LOOM_ISA_AVX2:
#if defined(LOOM_BUILT_ISA_AVX2)
    return true;
#else
    return false;
#endif
  case LOOM_ISA_AVX512:
#if defined(LOOM_BUILT_ISA_AVX512)
    return true;
#else
    return false;
#endif
  default:
    return false;
  }
}

static bool isa_on_cpu(loom_isa isa) {
  const loom_cpu_features *f = loom_cpu_get_features();
  switch (isa) {
  case LOOM_ISA_BASE:
    return true;
  case LOOM_ISA_AVX2:
    return f->avx2 && f->fma && f->f16c;
  case LOOM_ISA_AVX512: /* each copy's instructions include the one before's */
    return isa_on_cpu(LOOM_ISA_AVX2) && f->avx512f && f->avx512bw &&
           f->avx512vl && f->avx512dq;
  default:
    return false;
  }
}

bool loom_isa_available(loom_isa isa) {
  return isa_built(isa) && isa_on_cpu(isa);
}

/* -1: LOOM_ISA unset, empty or "auto"; LOOM_ISA_COUNT: a name that is not
 * an instruction set. */
static int isa_from_env(void) {
  const char *env = getenv("LOOM_ISA");
  if (!env || !*env || strcmp(env, "auto") == 0)
    return -1;
  for (int i = 0; i < LOOM_ISA_COUNT; i++)
    if (strcmp(env, isa_names[i]) == 0)
      return i;
  return LOOM_ISA_COUNT;
}

static atomic_int g_isa = -1;

loom_isa loom_cpu_isa(void) {
  int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
  if (isa >= 0)
    return (loom_isa)isa;
  int want = isa_from_env();
  if (want >= 0 && want < LOOM_ISA_COUNT && loom_isa_available(want)) {
    isa = want;
  } else {
    isa = LOOM_ISA_BASE;
    for (int i = LOOM_ISA_COUNT - 1; i > 0; i--)
      if (loom_isa_available((loom_isa)i)) {
        isa = i;
        break;
      }
  }
  int expected = -1;
  atomic_compare_exchange_strong(&g_isa, &expected, isa);
  return (loom_isa)atomic_load(&g_isa);
}

static void isa_list(char *buf, size_t cap, bool available_only) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < LOOM_ISA_COUNT; i++) {
    if (available_only && !loom_isa_available((loom_isa)i))
      continue;
    int n =
        snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", isa_names[i]);
    if (n < 0 || (size_t)n >= cap - len)
      break;
    len += (size_t)n;
  }
}

loom_status loom_cpu_check(void) {
  const int want = isa_from_env();
  if (want < 0)
    return LOOM_OK;
  char names[96], here[96];
  isa_list(names, sizeof names, false);
  isa_list(here, sizeof here, true);
  if (want == LOOM_ISA_COUNT)
    return loom_error(LOOM_ERR_CONFIG,
                      "LOOM_ISA=%s: not an instruction set; supported: auto, "
                      "%s",
                      getenv("LOOM_ISA"), names);
  if (!isa_built((loom_isa)want))
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "LOOM_ISA=%s: this build of loom has no %s copy of its "
                      "kernels; available here: %s",
                      loom_isa_name((loom_isa)want),
                      loom_isa_name((loom_isa)want), here);
  if (!isa_on_cpu((loom_isa)want))
    return loom_error(LOOM_ERR_UNSUPPORTED,
                      "LOOM_ISA=%s: this CPU cannot run it; available here: "
                      "%s",
                      loom_isa_name((loom_isa)want), here);
  return LOOM_OK;
}
