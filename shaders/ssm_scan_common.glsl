// Shared by the selective scan's kernels (ssm_scan.comp, ssm_scan_tiled.comp): included after
// their push constants, whose fields of these names mean the same in both.

float softplus_of(float v) {
    if (v > 20.0) return v;
    float e = exp(v), u = 1.0 + e;
    return u == 1.0 ? e : log(u) * (e / (u - 1.0));  // log1p(e) without losing small e
}

float softplus_slope(float v) { return v > 20.0 ? 1.0 : sigmoid_of(v); }

uint group_base(uint q, uint t, uint h) {  // B and C of head h at token t
    return ((q * pc.n_tok + t) * pc.n_group + h / (pc.n_head / pc.n_group)) * pc.d_state;
}

float a_of(uint h, uint n) { return pc.a.v[h * pc.a_rows + (pc.a_rows == 1 ? 0 : n)]; }

uint initial_state(uint q, uint h) {
    int r = clamp(pc.ids.v[q], 0, int(pc.n_rs) - 1);  // the CPU kernel refuses bad ids; here they are clamped
    return (uint(r) * pc.n_head + h) * pc.d_state * pc.head_dim;
}
