"""The C source's functions (the band, step, AdamW and pick loops, and `adaptfl_act` that runs
them in one call), after native_source.py's macros: one string, split over two files only to keep
each under this project's 400 lines."""

FUNCTIONS = r"""
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
