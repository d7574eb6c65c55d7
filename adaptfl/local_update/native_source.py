"""The C source of FedACT's CPU loops (native.py compiles it on first use).

Held as a Python string, not as a .c file, because a Flower App Bundle carries only .py, .toml,
.md, .yaml, .yml, .json and .jsonl files: a `.c` file beside native.py is left out of the FAB
that `flwr run` and a deployment install, so their ClientApps would run the eager passes. This is
the one copy of the source; native.py keys its build cache by a hash of it, so an edit here
rebuilds.
"""

SOURCE = r"""/* FedACT's AdamW direction, trust pass and step on the CPU, each one loop over the flat
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

/* [b, e): returns the first entry not done (fewer than VW left) */
static int64_t adam_band_vec(float *restrict u, const float *restrict a, float *restrict m,
                             float *restrict v, const float *restrict g, int64_t b, int64_t e,
                             const float *coef, int mk, int vk, float lo, float hi,
                             int64_t *restrict idx, float *restrict val, int64_t cap,
                             int64_t *restrict counts) {
  const vf w = V_SET(coef[0]), b2 = V_SET(coef[1]), c2 = V_SET(coef[2]), bc2 = V_SET(coef[3]);
  const vf eps = V_SET(coef[4]), q = V_SET(coef[5]), vlo = V_SET(lo), vhi = V_SET(hi);
  int64_t above = counts[0], inside = counts[1], i = b;
  float sv[VW];
  for (; i + VW <= e; i += VW) {
    vf gi = V_LD(g + i), mi = V_LD(m + i), vi = V_LD(v + i), d = V_SUB(gi, mi);
    vf mn = mk ? V_FMA(w, d, mi) : V_ADD(mi, V_MUL(w, d));
    vf cg = V_MUL(c2, gi);
    vf vn = vk == 1 ? V_FMA(cg, gi, V_MUL(vi, b2))
          : vk == 2 ? V_FMA(vi, b2, V_MUL(cg, gi)) : V_ADD(V_MUL(vi, b2), V_MUL(cg, gi));
    vf un = V_ADD(V_LD(a + i), V_DIV(V_MUL(q, mn), V_ADD(V_DIV(V_SQRT(vn), bc2), eps)));
    V_ST(m + i, mn);
    V_ST(v + i, vn);
    V_ST(u + i, un);
    vf s = V_MUL(un, gi);
    above += __builtin_popcount(V_GT(s, vhi));
    unsigned bits = V_IN(s, vlo, vhi);
    if (bits) {
      V_ST(sv, s);
      APPEND_BITS(bits)
    }
  }
  counts[0] = above;
  counts[1] = inside;
  return i;
}
#endif

/* one segment's [sb, se) (its body ends at `body`: torch's vector body, then its scalar tail) */
static void adam_band_segment(float *u, const float *a, float *m, float *v, const float *g,
                              int64_t sb, int64_t se, int64_t body, const float *coef, int kind,
                              float lo, float hi, int64_t *idx, float *val, int64_t cap,
                              int64_t *counts) {
  int64_t bb = sb;
#ifdef ADAM_BAND_VECTOR
  if (body > sb) /* the kernel's vector body in one loop; what is left as below */
    bb = adam_band_vec(u, a, m, v, g, sb, body < se ? body : se, coef, kind & 1, (kind >> 1) & 3,
                       lo, hi, idx, val, cap, counts);
#endif
  for (; bb < se; bb += ADAM_BLOCK) {
    int64_t be = bb + ADAM_BLOCK < se ? bb + ADAM_BLOCK : se;
    int64_t mid = body < bb ? bb : (body > be ? be : body);
    adam_range(u, a, m, v, g, bb, mid, coef[0], coef[1], coef[2], coef[3], coef[4], coef[5],
               kind & 1, (kind >> 1) & 3);
    adam_range(u, a, m, v, g, mid, be, coef[0], coef[1], coef[2], coef[3], coef[4], coef[5],
               (kind >> 3) & 1, (kind >> 4) & 3);
    band_range(u, 0, g, bb, be, lo, hi, idx, val, cap, counts);
  }
}

/* The first pass over nt ranges, one per thread: with m, torch's AdamW kernel on u (holding a:
   the addend, never NULL then) and the band, per segment; without, the band of u (+ a, if a).
   coef: w = 1 - beta1, b2, c2 = 1 - beta2, bc2 = sqrt(1 - beta2^t), eps, q = -lr / bc1 (as
   torch's kernel rounds them to float); vec: the kernel's vector length; counts: [2 * nt]
   (above, inside) per range; idx, val: nt blocks of cap positions, scores */
static void first_pass(float *u, const float *a, float *m, float *v, const float *const *gp,
                       const int64_t *off, int64_t nseg, int64_t n, const float *coef, int vec,
                       int kind, float lo, float hi, int64_t *idx, float *val, int64_t cap,
                       int64_t *counts, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int t = 0; t < nt; t++) {
    int64_t b = n * t / nt, e = n * (t + 1) / nt;
    counts[2 * t] = counts[2 * t + 1] = 0;
    if (m)
      FOR_SEGMENTS(b, e, adam_band_segment(u, a, m, v, g, sb, se,
                                           off[j] + (off[j + 1] - off[j]) / vec * vec, coef,
                                           kind, lo, hi, idx + t * cap, val + t * cap, cap,
                                           counts + 2 * t))
    else
      FOR_SEGMENTS(b, e, band_range(u, a, g, sb, se, lo, hi, idx + t * cap, val + t * cap, cap,
                                    counts + 2 * t))
  }
}

void adaptfl_band(float *u, const float *a, const float *const *gp, const int64_t *off,
                  int64_t nseg, int64_t n, float lo, float hi, int64_t *idx, float *val,
                  int64_t cap, int64_t *counts, int nt) {
  first_pass(u, a, 0, 0, gp, off, nseg, n, 0, 1, 0, lo, hi, idx, val, cap, counts, nt);
}

void adaptfl_adam_band(float *u, const float *a, float *m, float *v, const float *const *gp,
                       const int64_t *off, int64_t nseg, int64_t n, const float *coef,
                       int vec, int kind, float lo, float hi, int64_t *idx, float *val,
                       int64_t cap, int64_t *counts, int nt) {
  first_pass(u, a, m, v, gp, off, nseg, n, coef, vec, kind, lo, hi, idx, val, cap, counts, nt);
}

/* The selection among the band's entries (band.py's _pick): the r-th largest of val[0..m) by a
   three-way quickselect on a copy (ties stay cheap), then the first tie the top keeps no more.
   idx: ascending positions; nt blocks of cap entries, counts[2i + 1] used in the i-th (more:
   only the positions of the first cap were kept, which still selects in a band of one value,
   lo == hi, as when the scores tie at zero by the thousand: dead ReLUs; returns 2 if the first
   dropped tie was not kept, ipos[1] then the number of ties before it).
   out[0] = t (+0.0 for a zero); ipos[0] = #entries in the band, ipos[1] = the position of the
   first dropped tie, or n if none is dropped. Returns 1 if the k-th largest lies in the band. */
int adaptfl_pick(int64_t k, int64_t n, int64_t *idx, float *val, int64_t cap,
                 const int64_t *counts, int nt, float lo, float hi, float *work, float *out,
                 int64_t *ipos) {
  int64_t above = 0, m = 0, full = 0;
  ipos[0] = 0;
  for (int t = 0; t < nt; t++) {
    above += counts[2 * t];
    m += counts[2 * t + 1];
    full |= counts[2 * t + 1] > cap;
  }
  if (full) { /* more entries in a block than it holds: only a band of one value still selects */
    if (lo != hi || above >= k || k > above + m) return 0;
    /* every entry in the band equals lo: t = lo, and the top k keeps the first k - above of
       them in position order; the first one dropped is found here if it lies among those
       collected, else by the caller (return 2, ipos[1] = how many ties come before it) */
    int64_t need = k - above;
    ipos[0] = m;
    ipos[1] = n;
    out[0] = lo + 0.0f;
    for (int t = 0; t < nt && need < m; t++) {
      int64_t c = counts[2 * t + 1];
      if (need < c) {
        if (need >= cap) { ipos[1] = k - above; return 2; }
        ipos[1] = idx[t * cap + need];
        break;
      }
      need -= c;
    }
    return 1;
  }
  m = 0;
  for (int t = 0; t < nt; t++) {
    for (int64_t j = 0; j < counts[2 * t + 1]; j++) { /* compact the blocks, in order */
      idx[m + j] = idx[t * cap + j];
      val[m + j] = val[t * cap + j];
    }
    m += counts[2 * t + 1];
  }
  ipos[0] = m;
  if (above >= k || k > above + m) return 0;
  int64_t rank = k - above, wb = 0, we = m; /* the rank-th largest of work[wb..we) */
  for (int64_t j = 0; j < m; j++) work[j] = val[j];
  float t = 0.0f;
  for (;;) {
    float a = work[wb], b = work[wb + (we - wb) / 2], c = work[we - 1];
    float pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
    int64_t gt = wb, i = wb, lt = we; /* [wb, gt) > pivot, [gt, i) == pivot, [lt, we) < pivot */
    while (i < lt) {
      float x = work[i];
      if (x > pivot) { work[i] = work[gt]; work[gt++] = x; i++; }
      else if (x < pivot) { work[i] = work[--lt]; work[lt] = x; }
      else i++;
    }
    if (rank <= gt - wb) we = gt;
    else if (rank <= i - wb) { t = pivot; break; }
    else { rank -= i - wb; wb = i; }
  }
  t = t + 0.0f;
  int64_t greater = 0;
  for (int64_t j = 0; j < m; j++) greater += val[j] > t;
  int64_t need = k - above - greater, seen = 0; /* ties the top k keeps, >= 1 */
  ipos[1] = n;
  for (int64_t j = 0; j < m; j++) {
    if (val[j] == t && seen++ == need) { ipos[1] = idx[j]; break; }
  }
  out[0] = t;
  return 1;
}

/* the position of the entry s == t that has `before` others before it (s = u * g, g as
   segments), n if there is none: blocks of 1,024 counted (vectorised), the one holding it
   searched entry by entry */
static int64_t nth_tie(const float *u, const float *const *gp, const int64_t *off, int64_t nseg,
                       int64_t n, float t, int64_t before) {
  for (int64_t j = 0; j < nseg; j++) {
    const float *g = gp[j] - off[j];
    for (int64_t b = off[j]; b < off[j + 1]; b += 1024) {
      int64_t e = b + 1024 < off[j + 1] ? b + 1024 : off[j + 1], c = 0;
      for (int64_t i = b; i < e; i++) c += u[i] * g[i] == t;
      if (before >= c) { before -= c; continue; }
      for (int64_t i = b; i < e; i++)
        if (u[i] * g[i] == t && before-- == 0) return i;
    }
  }
  return n;
}

/* FedACT's whole step when the band holds the threshold: the AdamW-and-band pass (or the band
   pass alone where m is NULL: u given), the pick, then the step; one call, so Python runs
   nothing between the passes. Returns 0, after the first pass only, if the band missed.
   work: cap * nt + 1 floats (t at the end); ipos: #band entries, first dropped tie. */
int adaptfl_act(float *x, float *u, const float *a, float *m, float *v, const float *const *gp,
                const int64_t *off, int64_t nseg, int64_t n, const float *coef, int vec,
                int kind, float lo, float hi, int64_t *idx, float *val, int64_t cap,
                int64_t *counts, int nt, float *work, int64_t *ipos, int64_t k, float dec,
                int decay, float ca, float cg, int fused) {
  first_pass(u, a, m, v, gp, off, nseg, n, coef, vec, kind, lo, hi, idx, val, cap, counts, nt);
  float *t = work + cap * nt;
  int picked = adaptfl_pick(k, n, idx, val, cap, counts, nt, lo, hi, work, t, ipos);
  if (!picked) return 0;
  if (picked == 2) ipos[1] = nth_tie(u, gp, off, nseg, n, *t, ipos[1]);
  adaptfl_step(x, u, gp, off, nseg, n, *t, ipos[1], dec, decay, ca, cg, fused, 0, nt);
  return 1;
}
"""
