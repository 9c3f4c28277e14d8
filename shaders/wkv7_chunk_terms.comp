// wkv7_chunk_terms and its backward (native/cpu_wkv7_chunk_terms.cpp has the layouts and the
// formulas): what each chunk of rwkv_wkv7's chunked form computes from its own tokens, every chunk
// at once. Inputs r, k, v, a, b, log_decay [S, H, T] (the recurrence's: channels fastest), read as
// chunks of L tokens (the padding's tokens read as 0); the outputs W, U, Be, Ke, Rf, V [L, S, B]
// (tokens fastest), Q_rb, Q_rk [L, L, B], decay [S, B], P_ab, P_ak [L, L, B], B = H n_seqs c chunks
// (head fastest, then sequence, then chunk). Kernels:
//   PAIRS (a workgroup per chunk): P_ab, P_ak, Q_rb, Q_rk into the output; each pair (t, s) an
//     invocation's, its channels a block at a time through shared memory, each channel's decay a
//     running sum from s, as the CPU's.
//   SOLVE (an invocation per chunk and column: S of W's, then S of U's): the forward
//     substitution down the column, and on W's side the column's channel: A0, Rf, Be, Ke, V, decay.
//   The backward reads P_ab and P_ak from the forward's output.
//   BACK_SOLVE (an invocation per chunk and column): the back substitution, gA0 and gPV into
//     scratch [2S, L, B] (gA0's S channels, then gPV's); on gPV's side gv, on gA0's the start
//     decays' terms of ga, gr and glog_decay.
//   BACK_PAIRS (a workgroup per chunk): gP_ab, gP_ak (with the upstream gradient of the output's
//     P_ab, P_ak) into scratch [L, L, B] each.
//   BACK_CHANNELS (an invocation per chunk and channel): the pairs' terms and Be's and Ke's,
//     added to BACK_SOLVE's ga, gr and glog_decay; gb and gk.
// Every sum is an invocation's own, in a fixed order: no atomics, deterministic.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "staged_arrays.def"

layout(push_constant) uniform Push {
    Floats r;
    Floats k;
    Floats v;
    Floats a;
    Floats b;
    Floats log_decay;
    Floats o;        // the output: the forward's column, or the backward's [gr, gk, gv, ga, gb, glog_decay]
    Floats pairs;    // P_ab, P_ak [L, L, B] each: the forward's output's
    Floats columns;  // the backward's scratch: gA0, gPV [2S, L, B]; after them, BACK_CHANNELS' terms [S, L, B]
    Floats g;        // the backward's: the upstream gradient (like the forward's column)
    Floats fwd;      // the backward's: the forward's column (W, U)
    Floats grad_pairs;  // the backward's scratch: gP_ab, gP_ak [L, L, B] each
    uint S;
    uint L;
    uint B;          // chunks: H n_seqs c
    uint H;
    uint n_tok;      // tokens per sequence
    uint chunks;     // c, chunks per sequence
} pc;

uint block() { return pc.S * pc.L * pc.B; }
uint pair_block() { return pc.L * pc.L * pc.B; }
uint n_seqs() { return pc.B / (pc.H * pc.chunks); }
uint input_block() { return pc.S * pc.H * pc.n_tok * n_seqs(); }  // one of the inputs
// Whether chunk c's token t is one of its sequence's (not the padding).
bool valid(uint c, uint t) { return c / (pc.H * n_seqs()) * pc.L + t < pc.n_tok; }
// An input's element (channel j, token t) of chunk c, where valid(c, t).
uint input_at(uint c, uint t, uint j) {
    uint seq = c / pc.H % n_seqs(), at = c / (pc.H * n_seqs()) * pc.L + t;
    return (c % pc.H + pc.H * (seq * pc.n_tok + at)) * pc.S + j;
}
// An input's element, 0 for the padding's tokens (whose log decay 0 is a decay of 1).
float token_input(Floats x, uint c, uint t, uint j) { return element(x, input_at(c, t, j), valid(c, t)); }
// Chunk c's channel-major scratch element (token t, channel j).
uint scratch_at(uint c, uint t, uint j) { return (c * pc.L + t) * pc.S + j; }
// A [L, S, B] output's element (token t, channel j) of chunk c.
uint row_at(uint c, uint t, uint j) { return (c * pc.S + j) * pc.L + t; }
// A pair's element (t, s) of chunk c.
uint pair_at(uint c, uint t, uint s) { return (c * pc.L + s) * pc.L + t; }
// The backward's column col of gA0 (col < S) or gPV at token t of chunk c, in the columns' scratch.
uint column_at(uint c, uint t, uint col) { return (c * pc.L + t) * 2 * pc.S + col; }

#if defined(PAIRS) || defined(BACK_PAIRS)
// A block of channels' arrays in shared memory, [array][channel][token], each channel's tokens a
// row of L + 1 (odd: invocations reading down a column of tokens fall in different banks).
const uint STAGE = RK_CHUNK_TERMS_STAGE, MAX_PAIRS_EACH = 16;  // pairs of chunks of up to 64 tokens
shared float stage[STAGE];

uint block_channels() { return max(1u, min(pc.S, STAGE / 5u / (pc.L + 1u))); }
uint staged(uint array, uint cb, uint jj, uint t) { return (array * cb + jj) * (pc.L + 1u) + t; }

// Stages channels [j0, j0 + cb) of chunk c's tokens: from an input (channels fastest) where
// `tokens_fastest` is false, else from an [L, S, B] output (tokens fastest); coalesced either way.
void stage_array(uint array, Floats x, bool tokens_fastest, uint c, uint j0, uint cb) {
    for (uint e = gl_LocalInvocationID.x; e < cb * pc.L; e += 256) {
        uint jj, t;
        if (tokens_fastest) { t = e % pc.L; jj = e / pc.L; }
        else { jj = e % cb; t = e / cb; }
        stage[staged(array, cb, jj, t)] = tokens_fastest ? x.v[row_at(c, t, j0 + jj)] : token_input(x, c, t, j0 + jj);
    }
}
#endif

#if defined(PAIRS)
// stage arrays: a, b, k, r, log_decay
void main() {
    uint c = flat_group(), tid = gl_LocalInvocationID.x, L = pc.L, LL = L * L;
    if (c >= pc.B) return;  // a whole workgroup of the folded grid's padding
    float pab[MAX_PAIRS_EACH], pak[MAX_PAIRS_EACH], qrb[MAX_PAIRS_EACH], qrk[MAX_PAIRS_EACH];
    [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) { pab[m] = 0.0; pak[m] = 0.0; qrb[m] = 0.0; qrk[m] = 0.0; }
    uint cb_max = block_channels();
    for (uint j0 = 0; j0 < pc.S; j0 += cb_max) {
        uint cb = min(cb_max, pc.S - j0);
        barrier();  // the last block's reads are done
        stage_array(0, pc.a, false, c, j0, cb);
        stage_array(1, pc.b, false, c, j0, cb);
        stage_array(2, pc.k, false, c, j0, cb);
        stage_array(3, pc.r, false, c, j0, cb);
        stage_array(4, pc.log_decay, false, c, j0, cb);
        barrier();
        [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) {
            uint p = tid + 256 * m, t = p % L, s = p / L;
            if (p >= LL || s > t) continue;
            for (uint jj = 0; jj < cb; ++jj) {
                float sum = 0.0;  // the log decays over s < u < t, then through t
                for (uint u = s + 1; u < t; ++u) sum += stage[staged(4, cb, jj, u)];
                float b_s = stage[staged(1, cb, jj, s)], k_s = stage[staged(2, cb, jj, s)];
                if (s < t) {
                    float x = exp(sum), a_t = stage[staged(0, cb, jj, t)];
                    pab[m] += a_t * (b_s * x);
                    pak[m] += a_t * (k_s * x);
                    sum += stage[staged(4, cb, jj, t)];
                }
                float x = exp(sum), r_t = stage[staged(3, cb, jj, t)];
                qrb[m] += r_t * (b_s * x);
                qrk[m] += r_t * (k_s * x);
            }
        }
    }
    uint q_rb = 6 * block(), q_rk = q_rb + pair_block();
    [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) {
        uint p = tid + 256 * m, t = p % L, s = p / L;
        if (p >= LL) continue;
        uint at = pair_at(c, t, s);
        pc.pairs.v[at] = pab[m];
        pc.pairs.v[pair_block() + at] = pak[m];
        pc.o.v[q_rb + at] = qrb[m];
        pc.o.v[q_rk + at] = qrk[m];
    }
}
#endif

#if defined(SOLVE)
void main() {
    uint e = flat_invocation(), S = pc.S, L = pc.L;
    if (e >= 2 * S * pc.B) return;
    uint c = e / (2 * S), col = e % (2 * S), j = col % S;
    uint P_ab = 0, P_ak = pair_block();
    if (col < S) {  // W's column j: A0 = a start(t-1); the channel's Rf, Be, Ke, V and decay
        uint W = 0, Be = 2 * block(), Ke = 3 * block(), Rf = 4 * block(), V = 5 * block();
        uint decay = 6 * block() + 2 * pair_block();
        float sum = 0.0;
        for (uint t = 0; t < L; ++t) {
            float x = token_input(pc.a, c, t, j) * exp(sum);  // start(t-1): 1 at the first token
            for (uint s = 0; s < t; ++s) x += pc.pairs.v[P_ab + pair_at(c, t, s)] * pc.o.v[W + row_at(c, s, j)];
            pc.o.v[W + row_at(c, t, j)] = x;
            sum += token_input(pc.log_decay, c, t, j);
            pc.o.v[Rf + row_at(c, t, j)] = token_input(pc.r, c, t, j) * exp(sum);
            pc.o.v[V + row_at(c, t, j)] = token_input(pc.v, c, t, j);
        }
        pc.o.v[decay + c * S + j] = exp(sum);
        float after = 0.0;  // the log decays after token s, from the end
        for (uint s = L; s-- > 0;) {
            float x = exp(after);
            pc.o.v[Be + row_at(c, s, j)] = token_input(pc.b, c, s, j) * x;
            pc.o.v[Ke + row_at(c, s, j)] = token_input(pc.k, c, s, j) * x;
            after += token_input(pc.log_decay, c, s, j);
        }
    } else {  // U's column j: P_ak V, then the forward substitution
        uint U = block();
        for (uint t = 0; t < L; ++t) {
            float pv = 0.0;
            for (uint s = 0; s < t; ++s) pv += pc.pairs.v[P_ak + pair_at(c, t, s)] * token_input(pc.v, c, s, j);
            float x = pv;
            for (uint s = 0; s < t; ++s) x += pc.pairs.v[P_ab + pair_at(c, t, s)] * pc.o.v[U + row_at(c, s, j)];
            pc.o.v[U + row_at(c, t, j)] = x;
        }
    }
}
#endif

#if defined(BACK_SOLVE)
void main() {
    uint e = flat_invocation(), S = pc.S, L = pc.L;
    if (e >= 2 * S * pc.B) return;
    uint c = e / (2 * S), col = e % (2 * S), j = col % S;
    uint P_ab = 0, P_ak = pair_block();
    uint gx = col < S ? 0 : block();  // gW's or gU's column in g
    for (uint t = L; t-- > 0;) {  // G[t] = g[t] + sum over u > t of P_ab[u, t] G[u]
        float x = pc.g.v[gx + row_at(c, t, j)];
        for (uint u = t + 1; u < L; ++u) x += pc.pairs.v[P_ab + pair_at(c, u, t)] * pc.columns.v[column_at(c, u, col)];
        pc.columns.v[column_at(c, t, col)] = x;
    }
    uint gr = 0, gv = 2 * input_block(), ga = 3 * input_block(), glog = 5 * input_block();
    if (col >= S) {  // gv[s] = g of the V rows + the sum over t > s of P_ak[t, s] gPV[t]
        uint gV = 5 * block();
        for (uint s = 0; s < L; ++s) {
            float x = pc.g.v[gV + row_at(c, s, j)];
            for (uint t = s + 1; t < L; ++t) x += pc.pairs.v[P_ak + pair_at(c, t, s)] * pc.columns.v[column_at(c, t, col)];
            if (valid(c, s)) pc.o.v[gv + input_at(c, s, j)] = x;
        }
        return;
    }
    // the start decays: ga = gA0 start(t-1), gr = gRf start(t); glog_decay's terms start(t) (gRf r
    // + gA0[t + 1] a[t + 1], or + gdecay at the last), kept in BACK_CHANNELS' scratch, then summed
    // from the end
    uint gRf = 4 * block(), gdecay = 6 * block() + 2 * pair_block(), terms = 2 * block();
    float sum = 0.0;
    for (uint t = 0; t < L; ++t) {
        float g_a = pc.columns.v[column_at(c, t, col)] * exp(sum);
        sum += token_input(pc.log_decay, c, t, j);
        float start = exp(sum), g_rf = pc.g.v[gRf + row_at(c, t, j)];
        if (valid(c, t)) {
            pc.o.v[ga + input_at(c, t, j)] = g_a;
            pc.o.v[gr + input_at(c, t, j)] = g_rf * start;
        }
        float term = g_rf * token_input(pc.r, c, t, j);
        term += t + 1 < L ? pc.columns.v[column_at(c, t + 1, col)] * token_input(pc.a, c, t + 1, j)
                          : pc.g.v[gdecay + c * S + j];
        pc.columns.v[terms + scratch_at(c, t, j)] = start * term;
    }
    float acc = 0.0;
    for (uint t = L; t-- > 0;) {
        acc += pc.columns.v[terms + scratch_at(c, t, j)];
        if (valid(c, t)) pc.o.v[glog + input_at(c, t, j)] = acc;
    }
}
#endif

#if defined(BACK_PAIRS)
// stage arrays: gA0, gPV (from the columns' scratch), W, U (the forward's), v
void stage_columns(uint array, uint first, uint c, uint j0, uint cb) {
    for (uint e = gl_LocalInvocationID.x; e < cb * pc.L; e += 256) {
        uint jj = e % cb, t = e / cb;
        stage[staged(array, cb, jj, t)] = pc.columns.v[column_at(c, t, first + j0 + jj)];
    }
}

void main() {
    uint c = flat_group(), tid = gl_LocalInvocationID.x, L = pc.L, LL = L * L;
    if (c >= pc.B) return;
    float gab[MAX_PAIRS_EACH], gak[MAX_PAIRS_EACH];
    [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) { gab[m] = 0.0; gak[m] = 0.0; }
    uint cb_max = block_channels();
    for (uint j0 = 0; j0 < pc.S; j0 += cb_max) {
        uint cb = min(cb_max, pc.S - j0);
        barrier();
        stage_columns(0, 0, c, j0, cb);
        stage_columns(1, pc.S, c, j0, cb);
        stage_array(2, pc.fwd, true, c, j0, cb);
        stage_array(3, Floats(uint64_t(pc.fwd) + 4 * uint64_t(block())), true, c, j0, cb);  // U
        stage_array(4, pc.v, false, c, j0, cb);
        barrier();
        [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) {
            uint p = tid + 256 * m, t = p % L, s = p / L;
            if (p >= LL || s >= t) continue;
            for (uint jj = 0; jj < cb; ++jj) {
                float g_pv = stage[staged(1, cb, jj, t)];
                gab[m] += stage[staged(0, cb, jj, t)] * stage[staged(2, cb, jj, s)] + g_pv * stage[staged(3, cb, jj, s)];
                gak[m] += g_pv * stage[staged(4, cb, jj, s)];
            }
        }
    }
    uint g_ab = 6 * block() + 2 * pair_block() + pc.S * pc.B, g_ak = g_ab + pair_block();  // the output's P_ab, P_ak
    [[unroll]] for (uint m = 0; m < MAX_PAIRS_EACH; ++m) {
        uint p = tid + 256 * m, t = p % L, s = p / L;
        if (p >= LL) continue;
        uint at = pair_at(c, t, s);
        pc.grad_pairs.v[at] = s < t ? gab[m] + pc.g.v[g_ab + at] : 0.0;
        pc.grad_pairs.v[pair_block() + at] = s < t ? gak[m] + pc.g.v[g_ak + at] : 0.0;
    }
}
#endif

#if defined(BACK_CHANNELS)
void main() {
    uint e = flat_invocation(), S = pc.S, L = pc.L;
    if (e >= S * pc.B) return;
    uint c = e / S, j = e % S;
    uint gr = 0, gk = input_block(), ga = 3 * input_block(), gb = 4 * input_block(), glog = 5 * input_block();
    uint gBe = 2 * block(), gKe = 3 * block(), gQ_rb = 6 * block(), gQ_rk = gQ_rb + pair_block();
    uint gP_ab = 0, gP_ak = pair_block();
    uint terms = 2 * block();  // this channel's decay terms m[t], in the columns' scratch after gA0, gPV
    for (uint s = 0; s < L; ++s) {
        float b_s = token_input(pc.b, c, s, j), k_s = token_input(pc.k, c, s, j);
        float g_b = 0.0, g_k = 0.0, sum = 0.0;
        for (uint t = s; t < L; ++t) {
            if (t > s) sum += token_input(pc.log_decay, c, t, j);
            float x = exp(sum), r_t = token_input(pc.r, c, t, j);
            float cqb = pc.g.v[gQ_rb + pair_at(c, t, s)], cqk = pc.g.v[gQ_rk + pair_at(c, t, s)];
            float wq = cqb * b_s + cqk * k_s;
            if (valid(c, t)) pc.o.v[gr + input_at(c, t, j)] += x * wq;
            g_b += x * cqb * r_t;
            g_k += x * cqk * r_t;
            float term = r_t * wq;
            if (t + 1 < L) {
                float cpb = pc.grad_pairs.v[gP_ab + pair_at(c, t + 1, s)], cpk = pc.grad_pairs.v[gP_ak + pair_at(c, t + 1, s)];
                float a_n = token_input(pc.a, c, t + 1, j), wp = cpb * b_s + cpk * k_s;
                if (valid(c, t + 1)) pc.o.v[ga + input_at(c, t + 1, j)] += x * wp;
                g_b += x * cpb * a_n;
                g_k += x * cpk * a_n;
                term += a_n * wp;
            } else {
                float gbe = pc.g.v[gBe + row_at(c, s, j)], gke = pc.g.v[gKe + row_at(c, s, j)];
                g_b += x * gbe;
                g_k += x * gke;
                term += gbe * b_s + gke * k_s;
            }
            pc.columns.v[terms + scratch_at(c, t, j)] = x * term;
        }
        if (valid(c, s)) {
            pc.o.v[gb + input_at(c, s, j)] = g_b;
            pc.o.v[gk + input_at(c, s, j)] = g_k;
        }
        float acc = 0.0;  // X(s, t)'s range holds u for s < u <= t: suffix sums over t
        for (uint u = L - 1; u > s; --u) {
            acc += pc.columns.v[terms + scratch_at(c, u, j)];
            if (valid(c, u)) pc.o.v[glog + input_at(c, u, j)] += acc;
        }
    }
}
#endif
