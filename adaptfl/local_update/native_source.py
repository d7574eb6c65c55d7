"""The C source of FedACT's CPU loops (native.py compiles it on first use).

Held as a Python string, not as a .c file, because a Flower App Bundle carries only .py, .toml,
.md, .yaml, .yml, .json and .jsonl files: a `.c` file beside native.py is left out of the FAB
that `flwr run` and a deployment install, so their ClientApps would run the eager passes. This is
the one copy of the source (its functions in native_functions.py); native.py keys its build
cache by a hash of it, so an edit here rebuilds.
"""

from adaptfl.local_update.native_functions import FUNCTIONS

_MACROS = r"""/* FedACT's AdamW direction, trust pass and step on the CPU, each one loop over the flat
   vectors (native.py compiles this once per machine and checks it against torch's fused
   AdamW kernel and eager passes before use).

   adaptfl_band:  u = a + u (if a), s = u * g; counts #(s > hi) and collects the positions and
                  scores of lo <= s <= hi (the band selection of band.py, without storing s)
   adaptfl_adam_band: torch's fused AdamW kernel on u (holding a) and adaptfl_band in one pass:
                  m, v updated, u = a + q * m / (sqrt(v) / b + e), then the band of s = u * g;
                  the same float operations per entry as torch's kernel (native.py checks which
                  of its possible contractions into fused multiply-adds this torch has)
   adaptfl_pick:  the k-th largest score from the band's entries and the first tie it drops
   adaptfl_act:   the first pass, the pick and the step in one call (the band holding t)
   adaptfl_step:  x = x * dec (if decay), then x + u * f with f = ca on the top k (s > t, or
                  s == t below position `cut`: ties to the lower index), cg elsewhere; as fused
                  multiply-add or as product then sum, whichever torch's addcmul_ does here;
                  s = u * g, or g itself where the caller has stored the scores there

   g comes as segments (the parameters' own gradients, or one flat vector). Work is split into
   nt equal ranges, one per OpenMP thread (torch's own runtime when it is loaded) or, compiled
   without OpenMP, run one after another. */
#include <stdint.h>

#include <math.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* the positions of the set bits of `bits` (lanes of the block at i) */
#define APPEND_BITS(bits)                                                        \
  while (bits) {                                                                 \
    int l_ = __builtin_ctz(bits);                                                \
    if (inside < cap) { idx[inside] = i + l_; val[inside] = sv[l_]; }            \
    inside++;                                                                    \
    bits &= bits - 1;                                                            \
  }

/* g[i] for i in [b, e): entries of one segment, addressed by their position in the vector */
static void band_range(float *restrict u, const float *restrict a, const float *restrict g,
                       int64_t b, int64_t e, float lo, float hi, int64_t *restrict idx,
                       float *restrict val, int64_t cap, int64_t *restrict counts) {
  int64_t above = counts[0], inside = counts[1], i = b;
  float sv[16];
#if defined(__AVX512F__)
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  for (; i + 16 <= e; i += 16) {
    __m512 uv = _mm512_loadu_ps(u + i);
    if (a) { uv = _mm512_add_ps(_mm512_loadu_ps(a + i), uv); _mm512_storeu_ps(u + i, uv); }
    __m512 s = _mm512_mul_ps(uv, _mm512_loadu_ps(g + i));
    _mm512_storeu_ps(sv, s);
    above += __builtin_popcount(_mm512_cmp_ps_mask(s, vhi, _CMP_GT_OQ));
    unsigned bits = _mm512_cmp_ps_mask(s, vlo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(s, vhi, _CMP_LE_OQ);
    APPEND_BITS(bits)
  }
#elif defined(__AVX2__)
  const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  for (; i + 8 <= e; i += 8) {
    __m256 uv = _mm256_loadu_ps(u + i);
    if (a) { uv = _mm256_add_ps(_mm256_loadu_ps(a + i), uv); _mm256_storeu_ps(u + i, uv); }
    __m256 s = _mm256_mul_ps(uv, _mm256_loadu_ps(g + i));
    _mm256_storeu_ps(sv, s);
    above += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(s, vhi, _CMP_GT_OQ)));
    unsigned bits = _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(s, vlo, _CMP_GE_OQ),
                                                     _mm256_cmp_ps(s, vhi, _CMP_LE_OQ)));
    APPEND_BITS(bits)
  }
#endif
  for (; i < e; i++) {  /* the rest, or all of it without AVX */
    float ui = a ? a[i] + u[i] : u[i];
    if (a) u[i] = ui;
    float s = ui * g[i];
    above += s > hi;
    if (s >= lo && s <= hi) {
      if (inside < cap) { idx[inside] = i; val[inside] = s; }
      inside++;
    }
  }
  counts[0] = above;
  counts[1] = inside;
}

/* g as segments: entries off[j] .. off[j+1] - 1 of the vector at gp[j] (j < nseg); the
   segment that holds position b */
static int64_t segment_of(const int64_t *off, int64_t nseg, int64_t b) {
  int64_t lo = 0, hi = nseg - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= b) lo = mid; else hi = mid - 1;
  }
  return lo;
}

#define FOR_SEGMENTS(b, e, CALL)                                                   \
  for (int64_t j = segment_of(off, nseg, b); j < nseg && off[j] < e; j++) {        \
    int64_t sb = off[j] > b ? off[j] : b, se = off[j + 1] < e ? off[j + 1] : e;    \
    const float *g = gp[j] - off[j];                                               \
    if (sb < se) CALL;                                                             \
  }

#define STEP_LOOP(KEEP, COMBINE)                                          \
  for (int64_t i = b; i < e; i++) {                                       \
    float s = scored ? g[i] : u[i] * g[i];                                \
    float f = (KEEP) ? ca : cg;                                           \
    float xi = decay ? x[i] * dec : x[i];                                 \
    x[i] = COMBINE;                                                       \
  }

static void step_range(float *restrict x, const float *restrict u, const float *restrict g,
                       int64_t b, int64_t e, float t, float dec, int decay, float ca,
                       float cg, int fused, int scored, int ties) {
  /* ties: s == t counts as kept in this range (it lies below the cut); scored: g holds s */
  if (fused && ties) STEP_LOOP(s >= t, __builtin_fmaf(u[i], f, xi))
  else if (fused) STEP_LOOP(s > t, __builtin_fmaf(u[i], f, xi))
  else if (ties) STEP_LOOP(s >= t, xi + u[i] * f)
  else STEP_LOOP(s > t, xi + u[i] * f)
}

void adaptfl_step(float *x, const float *u, const float *const *gp, const int64_t *off,
                  int64_t nseg, int64_t n, float t, int64_t cut, float dec, int decay, float ca,
                  float cg, int fused, int scored, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int k = 0; k < nt; k++) {
    int64_t b = n * k / nt, e = n * (k + 1) / nt;
    int64_t mid = cut < b ? b : (cut > e ? e : cut);
    FOR_SEGMENTS(b, mid, step_range(x, u, g, sb, se, t, dec, decay, ca, cg, fused, scored, 1))
    FOR_SEGMENTS(mid, e, step_range(x, u, g, sb, se, t, dec, decay, ca, cg, fused, scored, 0))
  }
}

/* torch's fused AdamW kernel, entry by entry: its vector body and its scalar tail (the last
   len % vec entries of each tensor) may contract different products into fused multiply-adds,
   so `kind` says how each does (found by native.py against the kernel): bit 0, the body's
   m = m + w (g - m) as one fma; bits 1-2, the body's v = v b2 + (c2 g) g as no fma (0), as
   fma(c2 g, g, v b2) (1) or as fma(v, b2, (c2 g) g) (2); bit 3, bits 4-5 the same for the tail. */
#define ADAM_LOOP(MNEW, VNEW)                                                      \
  for (int64_t i = b; i < e; i++) {                                                \
    float gi = g[i], mi = m[i], vi = v[i], cg = c2 * gi;                           \
    float mn = MNEW, vn = VNEW;                                                    \
    m[i] = mn; v[i] = vn;                                                          \
    u[i] = a[i] + (q * mn) / (sqrtf(vn) / bc2 + eps);                              \
  }

static void adam_range(float *restrict u, const float *restrict a, float *restrict m,
                       float *restrict v, const float *restrict g, int64_t b, int64_t e,
                       float w, float b2, float c2, float bc2, float eps, float q, int mk,
                       int vk) {
  switch (mk * 3 + vk) {
    case 0: ADAM_LOOP(mi + w * (gi - mi), vi * b2 + cg * gi) break;
    case 1: ADAM_LOOP(mi + w * (gi - mi), fmaf(cg, gi, vi * b2)) break;
    case 2: ADAM_LOOP(mi + w * (gi - mi), fmaf(vi, b2, cg * gi)) break;
    case 3: ADAM_LOOP(fmaf(w, gi - mi, mi), vi * b2 + cg * gi) break;
    case 4: ADAM_LOOP(fmaf(w, gi - mi, mi), fmaf(cg, gi, vi * b2)) break;
    default: ADAM_LOOP(fmaf(w, gi - mi, mi), fmaf(vi, b2, cg * gi)) break;
  }
}

#define ADAM_BLOCK 2048 /* entries per sub-pass: the band then reads u and g from L1/L2 */

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* The same entry by entry as adam_range then band_range, in one vector loop: the scores and
   their compares on the registers that computed u (a second loop over the block cost about a
   third of the AdamW arithmetic itself) */
#if defined(__AVX512F__)
#define VW 16
typedef __m512 vf;
#define V_LD _mm512_loadu_ps
#define V_ST _mm512_storeu_ps
#define V_SET _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_DIV _mm512_div_ps
#define V_SQRT _mm512_sqrt_ps
#define V_FMA _mm512_fmadd_ps
#define V_GT(x, y) ((unsigned)_mm512_cmp_ps_mask(x, y, _CMP_GT_OQ))
#define V_IN(x, l, h) \
  ((unsigned)(_mm512_cmp_ps_mask(x, l, _CMP_GE_OQ) & _mm512_cmp_ps_mask(x, h, _CMP_LE_OQ)))
#else
#define VW 8
typedef __m256 vf;
#define V_LD _mm256_loadu_ps
#define V_ST _mm256_storeu_ps
#define V_SET _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_DIV _mm256_div_ps
#define V_SQRT _mm256_sqrt_ps
#define V_FMA _mm256_fmadd_ps
#define V_GT(x, y) ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x, y, _CMP_GT_OQ)))
#define V_IN(x, l, h)                                             \
  ((unsigned)_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(x, l, _CMP_GE_OQ), \
                                              _mm256_cmp_ps(x, h, _CMP_LE_OQ))))
#endif
#define ADAM_BAND_VECTOR 1
"""

SOURCE = _MACROS + FUNCTIONS
