// The Vulkan column of the op table for the sequences' chunked forms: rwkv_wkv7's (each chunk's own
// terms, the state passed from chunk to chunk), ssm_scan's (SSD) and gated_linear_attn's, each
// chunk's work at once where it can be and only the states passed along the chunks in order.
// Their recurrences: vk_sequence_kernels.cpp.
#include <algorithm>
#include <cmath>

#include "kernel_util.hpp"
#include "ssd_chunks.hpp"
#include "staged_arrays.def"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"
#include "vulkan/vk_sequence_util.hpp"

namespace rk {

using vk::check_loop_budget;
using vk::ctx;
using vk::groups;
using vk::kLoopMargin;
using vk::record;
using vk::span;
using vk::spans;
using vk::u32;

// ---- RWKV-7's chunked form: what each chunk computes from its own tokens -----------------------

namespace {

struct ChunkTermsPush {
    uint64_t r, k, v, a, b, log_decay, o, pairs, columns, g, fwd, grad_pairs;
    uint32_t S, L, B, H, n_tok, chunks;
};

// Whether a staged kernel's shared arrays of `floats` fit the device's shared memory (lavapipe
// offers 32 KiB, NVIDIA's Vulkan driver 48 KiB, Vulkan promises 16 KiB).
bool shared_memory_holds(int64_t floats) { return uint64_t(floats) * 4 <= ctx().limits().max_shared_memory; }

// wkv7_chunk_terms.comp keeps up to 16 pairs of a chunk in each invocation's registers, and stages
// its inputs in RK_CHUNK_TERMS_STAGE floats of shared memory.
constexpr int64_t kChunkTermsMaxTokens = 64;

// wkv7_chunk_terms.comp's loops per invocation at their largest trip counts: PAIRS' (per block of
// channels its staging, then each of an invocation's pairs' channels and range, the longest range
// that of the pair ending at the last token), and the per-column and per-channel kernels' walks
// over the chunk's pairs.
double chunk_terms_loop_iterations(int64_t S, int64_t L) {
    const int64_t cb = std::max<int64_t>(1, std::min<int64_t>(S, RK_CHUNK_TERMS_STAGE / 5 / (L + 1)));  // block_channels()
    const int64_t blocks = (S + cb - 1) / cb, slots = (L * L + 255) / 256;
    double pairs = 5.0 * double((cb * L + 255) / 256);
    for (int64_t m = 0; m < slots; ++m) pairs += double(cb) * double(1 + std::max<int64_t>(0, L - 2 - 256 * m / L));
    return kLoopMargin * std::max(double(blocks) * pairs, 2.0 * double(L) * double(L + 1));
}

// The shape rule has checked the inputs (r, k, v, a, b, log_decay [S, H, T] at in[first..]) and
// the ints (L, n_seqs); refuses chunks longer than the kernels hold, and loops the device would cut
// short.
ChunkTermsPush chunk_terms_push(const char* op, const Inputs& in, size_t first, const OpAttrs& attrs) {
    const TensorImpl& r = *in[first];
    const int64_t S = r.ne[0], H = r.ne[1], L = attrs.ints[0], n_seqs = attrs.ints[1];
    const int64_t n_tok = r.ne[2] / n_seqs, chunks = (n_tok + L - 1) / L, B = H * chunks * n_seqs;
    if (L > kChunkTermsMaxTokens)
        throw std::invalid_argument(std::string(op) + ": chunks of at most " + std::to_string(kChunkTermsMaxTokens) +
                                    " tokens on the GPU, got " + std::to_string(L));
    if (!shared_memory_holds(RK_CHUNK_TERMS_STAGE))
        throw std::runtime_error(std::string(op) + ": " + ctx().device_name() + " offers " +
                                 std::to_string(ctx().limits().max_shared_memory) + " bytes of shared memory, the kernels need " +
                                 std::to_string(4 * RK_CHUNK_TERMS_STAGE) + "; run rwkv_wkv7's chunked form on the CPU, or "
                                 "its recurrence (chunk_size=None)");
    check_loop_budget(op, L, "tokens per chunk", chunk_terms_loop_iterations(S, L));
    u32(size_mul(6, r.numel()), op);  // every index in the shaders is smaller
    u32(size_add(size_mul(7, S, L, B), size_mul(4, L, L, B)), op);
    ChunkTermsPush p{};
    p.r = r.address(), p.k = in[first + 1]->address(), p.v = in[first + 2]->address();
    p.a = in[first + 3]->address(), p.b = in[first + 4]->address(), p.log_decay = in[first + 5]->address();
    p.S = u32(S, op), p.L = u32(L, op), p.B = u32(B, op);
    p.H = u32(H, op), p.n_tok = u32(n_tok, op), p.chunks = u32(chunks, op);
    return p;
}

// The address of the output's P_ab (P_ak follows it), after W, U, Be, Ke, Rf, V, Q_rb, Q_rk, decay.
uint64_t kept_pairs_address(const TensorImpl& terms, const ChunkTermsPush& p) {
    return terms.address() + 4 * (uint64_t(6) * p.S * p.L * p.B + uint64_t(2) * p.L * p.L * p.B + uint64_t(p.S) * p.B);
}

}  // namespace

// wkv7_chunk_terms: PAIRS (a workgroup per chunk), then SOLVE (an invocation per chunk and column).
void vk_wkv7_chunk_terms(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "wkv7_chunk_terms";
    ChunkTermsPush p = chunk_terms_push(op, in, 0, attrs);
    p.o = out.address(), p.pairs = kept_pairs_address(out, p);
    record("wkv7_chunk_terms_pairs", p, p.B, spans(in), {span(out)});
    std::vector<vk::Range> reads = spans(in);
    reads.push_back(span(out));  // the pairs
    record("wkv7_chunk_terms_solve", p, groups(uint64_t(2) * p.S * p.B), reads, {span(out)});
}

// wkv7_chunk_terms_back: BACK_SOLVE, BACK_PAIRS, BACK_CHANNELS, with P_ab and P_ak the forward's.
void vk_wkv7_chunk_terms_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "wkv7_chunk_terms_back";
    ChunkTermsPush p = chunk_terms_push(op, in, 1, attrs);
    TensorPtr grad_pairs = make_on(Device::gpu, {size_mul(2, p.L, p.L, p.B), 1, 1, 1}, 2, DType::f32);
    TensorPtr columns = make_on(Device::gpu, {size_mul(3, p.S, p.L, p.B), 1, 1, 1}, 2, DType::f32);
    p.o = out.address(), p.pairs = kept_pairs_address(*in[7], p), p.columns = columns->address();
    p.g = in[0]->address(), p.fwd = in[7]->address(), p.grad_pairs = grad_pairs->address();
    std::vector<vk::Range> reads = spans(in);
    record("wkv7_chunk_terms_back_solve", p, groups(uint64_t(2) * p.S * p.B), reads, {span(*columns), span(out)});
    reads.push_back(span(*columns));
    record("wkv7_chunk_terms_back_pairs", p, p.B, reads, {span(*grad_pairs)});
    reads.push_back(span(*grad_pairs));
    reads.push_back(span(out));
    record("wkv7_chunk_terms_back_channels", p, groups(uint64_t(p.S) * p.B), reads, {span(out), span(*columns)});
}

// ---- RWKV-7's chunked form: the state passed from chunk to chunk ----------------------------

namespace {

// wkv7_chunks.comp's loops per chunk at their largest trip counts: the forward's T (L S outputs
// over S terms) and next state (S S outputs over L terms); the backward's T, dT and gV, its gB,
// gK, gW and gdecay, and its walking gradient.
double wkv7_chunks_loop_iterations(int64_t L, int64_t S, int64_t chunks, bool backward) {
    const double LS = std::ceil(double(L * S) / 256.0), SS = std::ceil(double(S * S) / 256.0), s = double(S);
    const double per_chunk = backward ? 2.0 * LS * (1.0 + s) + LS * (1.0 + s) + std::ceil(s / 256.0) * (1.0 + s) +
                                            SS * (1.0 + double(L))
                                      : LS * (1.0 + s) + SS * (1.0 + double(L));
    return kLoopMargin * (double(chunks) * per_chunk + SS);
}

// wkv7_chunks.comp's FORWARD_STAGED: a workgroup per batch and block of kStagedBlockColumns value
// columns, its shared arrays of kStagedInputFloats (the chunk's W, B, K with rows of L + 1),
// kStagedBlockStateFloats (the block's state with rows of columns + 1) and kStagedSmallFloats
// (the block's T and V): 31.6 KiB, within lavapipe's 32 (staged_arrays.def).
constexpr int64_t kStagedBlockColumns = RK_WKV7_FORWARD_BLOCK_COLUMNS, kStagedInputFloats = RK_WKV7_STAGED_INPUTS,
                  kStagedBlockStateFloats = RK_WKV7_FORWARD_BLOCK_STATE, kStagedSmallFloats = RK_WKV7_FORWARD_SMALL;

bool staged_chunk_states_fit(int64_t L, int64_t S) {
    const int64_t columns = std::min(kStagedBlockColumns, S);
    return (L + 1) * S <= kStagedInputFloats && S * (columns + 1) <= kStagedBlockStateFloats &&
           (L + 1) * columns <= kStagedSmallFloats &&
           shared_memory_holds(3 * kStagedInputFloats + kStagedBlockStateFloats + 2 * kStagedSmallFloats);
}

// Its loops per invocation at their largest trip counts: per chunk the loads into registers and
// their stores into shared memory (a pass over each register array), T (S terms each), the next
// state (L terms each) and its write.
double staged_chunk_states_loop_iterations(int64_t L, int64_t S, int64_t chunks) {
    const int64_t columns = std::min(kStagedBlockColumns, S);
    const double LC = std::ceil(double(L * columns) / 256.0), SC = std::ceil(double(S * columns) / 256.0);
    const double loads = 2.0 * double((kStagedInputFloats + kStagedSmallFloats + kStagedBlockStateFloats + 3 * 255) / 256);
    return kLoopMargin * (double(chunks) * (loads + LC * (2.0 + double(S)) + SC * (2.0 + double(L))) + SC + LC);
}

// wkv7_chunks.comp's BACK_WALK and BACK_SUMS: the walk a workgroup per batch and block of
// kWalkColumns value columns, its D (rows of columns + 1) and dT (rows of L + 1) in shared memory;
// the sums a workgroup per chunk and block of at most kSumsRows key rows and kSumsOutputs outputs,
// kSumsTerms terms at a time (staged_arrays.def).
constexpr int64_t kWalkColumns = RK_WKV7_WALK_COLUMNS, kWalkStateFloats = RK_WKV7_WALK_STATE,
                  kWalkDTFloats = RK_WKV7_WALK_DT, kWalkStagedColumns = RK_WKV7_WALK_STAGED_COLUMNS,
                  kWalkStagedStateFloats = RK_WKV7_WALK_STAGED_STATE, kSumsTerms = RK_WKV7_SUMS_TERMS,
                  kSumsRows = RK_WKV7_SUMS_ROWS, kSumsOutputs = RK_WKV7_SUMS_OUTPUTS;

bool chunk_states_back_splits(int64_t L, int64_t S) {
    return S * (kWalkColumns + 1) <= kWalkStateFloats && (L + 1) * kWalkColumns <= kWalkDTFloats &&
           L * kSumsTerms <= kSumsOutputs && shared_memory_holds(kWalkStateFloats + kWalkDTFloats) &&
           shared_memory_holds(3 * kSumsOutputs + 2 * kSumsRows * kSumsTerms);
}

// The walk's STAGED form: blocks of kWalkStagedColumns, the chunk's W, B and K in shared memory
// too, each chunk's inputs loaded while the chunk before it is summed.
bool staged_walk_fits(int64_t L, int64_t S) {
    return (L + 1) * S <= kStagedInputFloats && S * (kWalkStagedColumns + 1) <= kWalkStagedStateFloats &&
           (L + 1) * kWalkStagedColumns <= kWalkDTFloats &&
           shared_memory_holds(3 * kStagedInputFloats + kWalkStagedStateFloats + kWalkDTFloats);
}

// The key rows of one BACK_SUMS workgroup (the shader's IB).
int64_t sums_rows(int64_t L, int64_t S) { return std::min({S, kSumsRows, kSumsOutputs / L}); }

// The walk's loops per invocation at their largest trip counts: per chunk the STAGED form's loads
// (W, B, K by elements of [L, S], the rest by outputs), dT and gV (S terms each), D written out,
// D's update (L terms each); the sums' per block of terms: the loads, the products (four outputs
// of kSumsTerms terms each) and gdecay's.
double walk_loop_iterations(int64_t L, int64_t S, int64_t chunks, int64_t columns) {
    const double LC = std::ceil(double(L * columns) / 256.0), SC = std::ceil(double(S * columns) / 256.0),
                 loads = 2.0 * std::ceil(double(L * S) / 256.0) + SC + LC;
    return kLoopMargin * (double(chunks) * (loads + LC * (1.0 + double(S)) + SC * (2.0 + double(L))) + 2.0 * SC + LC);
}

double sums_loop_iterations(int64_t L, int64_t S) {
    const double terms = double(kSumsTerms), blocks = std::ceil(double(S) / terms);
    const double loads = std::ceil(double(L) * terms / 256.0) + std::ceil(double(sums_rows(L, S)) * terms / 256.0);
    return kLoopMargin * (blocks * (loads + double(kSumsOutputs / 256) * (1.0 + terms) + terms) + 8.0);
}

struct Wkv7ChunksPush {
    uint64_t W, U, B, K, V, decay, Z0, o;
    uint32_t L, S, N, c;
};

struct Wkv7ChunksBackPush {
    uint64_t W, U, B, K, V, decay, Z0, o, g, Z, ends;
    uint32_t L, S, N, c;
};

}  // namespace

// wkv7_chunk_states and its backward: a workgroup per batch and block of value columns where the
// staged forward fits, else per batch; the backward's walk and sums (two kernels, the walk's D
// after each chunk in a buffer of its own) where chunk_states_back_splits allows, else one
// workgroup per batch. Shapes checked by the shape rule.
void vk_wkv7_chunk_states(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& W = *in[0];
    const char* op = "wkv7_chunk_states";
    Wkv7ChunksPush p{W.address(), in[1]->address(), in[2]->address(), in[3]->address(), in[4]->address(),
                     in[5]->address(), in[6]->address(), out.address(), u32(W.ne[0], op), u32(W.ne[1], op),
                     u32(W.ne[2], op), u32(W.ne[3], op)};
    u32(out.numel(), op);  // every index in the shader is smaller
    const std::vector<vk::Range> reads = spans(in);
    if (staged_chunk_states_fit(W.ne[0], W.ne[1])) {
        check_loop_budget(op, W.ne[0] * W.ne[3], "tokens per sequence",
                          staged_chunk_states_loop_iterations(W.ne[0], W.ne[1], W.ne[3]));
        const uint64_t blocks = uint64_t((W.ne[1] + kStagedBlockColumns - 1) / kStagedBlockColumns);
        record("wkv7_chunks_forward_staged", p, uint64_t(p.N) * blocks, reads, {span(out)});
        return;
    }
    check_loop_budget(op, W.ne[0] * W.ne[3], "tokens per sequence",
                          wkv7_chunks_loop_iterations(W.ne[0], W.ne[1], W.ne[3], false));
    record("wkv7_chunks_forward", p, uint64_t(p.N), reads, {span(out)});
}

void vk_wkv7_chunk_states_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& W = *in[1];
    const char* op = "wkv7_chunk_states_back";
    const int64_t L = W.ne[0], S = W.ne[1], c = W.ne[3];
    Wkv7ChunksBackPush p{W.address(), in[2]->address(), in[3]->address(), in[4]->address(), in[5]->address(),
                         in[6]->address(), in[7]->address(), out.address(), in[0]->address(), in[8]->address(),
                         0, u32(L, op), u32(S, op), u32(W.ne[2], op), u32(c, op)};
    u32(out.numel(), op);
    u32(in[0]->numel(), op);
    std::vector<vk::Range> reads = spans(in);
    if (!chunk_states_back_splits(L, S)) {
        check_loop_budget(op, L * c, "tokens per sequence", wkv7_chunks_loop_iterations(L, S, c, true));
        record("wkv7_chunks_backward", p, uint64_t(p.N), reads, {span(out)});
        return;
    }
    const bool staged = staged_walk_fits(L, S);
    const int64_t columns = staged ? kWalkStagedColumns : kWalkColumns;
    check_loop_budget(op, L * c, "tokens per sequence", walk_loop_iterations(L, S, c, columns));
    check_loop_budget(op, S, "head size", sums_loop_iterations(L, S));
    TensorPtr ends = make_on(Device::gpu, {size_mul(S, S, W.ne[2], c), 1, 1, 1}, 2, DType::f32);
    u32(ends->numel(), op);
    p.ends = ends->address();
    const uint64_t column_blocks = uint64_t((S + columns - 1) / columns);
    const char* walk = staged ? "wkv7_chunks_back_walk_staged" : "wkv7_chunks_back_walk";
    record(walk, p, uint64_t(p.N) * column_blocks, reads, {span(out), span(*ends)});
    reads.push_back(span(out));
    reads.push_back(span(*ends));
    const int64_t rows = sums_rows(L, S);
    record("wkv7_chunks_back_sums", p, uint64_t(p.N) * uint64_t(c) * uint64_t((S + rows - 1) / rows), reads, {span(out)});
}

// ---- ssm_scan's chunked form (SSD): every chunk's work at once, the states passed in order ------

namespace {

struct SsdPush {
    uint64_t u, la, B, C, g, states, aux, o, bc, per_chunk, scores, pairs_g;
    uint32_t P, H, T, N, D, G, L, c;
};

struct SsdPassPush {
    uint64_t planes, decay, edge, last;
    uint32_t R, H, c, N;
    uint32_t rows;  // decays per plane (ssd_pass.comp)
};

constexpr uint64_t kFloat = sizeof(float);

// An invocation's loop iterations at their largest trip counts (ssd_chunks.comp's backward kernels
// loop the most: their products, each 260 iterations per 16 terms, over 64 x 64 blocks of their
// outputs), and the passing's, refused where the device would cut them short.
void check_ssd_loops(const char* op, const SsdDims& d) {
    auto product = [](int64_t terms) { return 260.0 * double((terms + 15) / 16); };
    const double blocks_D = double((d.D + 63) / 64), blocks_P = double((d.P + 63) / 64);
    const double grads_u = double(d.L) + blocks_P * (product(d.L) + product(d.D));
    // GRADS_PAIRS: G's product, gA's share, the pair decays, the sums down columns and along rows
    const double grads_pairs = product(d.P) + double(d.D * d.P) / 256 + 3.0 * double(d.L);
    const double state_grads = blocks_D * product(d.P) + 16;
    const double heads = double(d.H / d.G);
    const double pair_grads = double(d.L * d.L + 255) / 256 * heads + blocks_D * 2 * product(d.L) +
                              (double(d.L) * heads + 255) / 256 * double(d.L);
    check_loop_budget(op, d.L, "tokens per chunk",
                      kLoopMargin * std::max({grads_u, grads_pairs, state_grads, pair_grads, product(d.D)}));
    check_loop_budget(op, d.c, "chunks per sequence", kLoopMargin * double(d.c));
}

SsdPush ssd_push(const SsdDims& d, const Inputs& in, size_t first, const char* op) {
    SsdPush p{};
    p.u = in[first]->address();
    p.la = in[first + 1]->address();
    p.B = in[first + 2]->address();
    p.C = in[first + 3]->address();
    p.P = u32(d.P, op), p.H = u32(d.H, op), p.T = u32(d.T, op), p.N = u32(d.N, op);
    p.D = u32(d.D, op), p.G = u32(d.G, op), p.L = u32(d.L, op), p.c = u32(d.c, op);
    return p;
}

// Records S of every (chunk, group, sequence) into scratch [L L, G, c, N] (ssd_chunks.comp's SCORES)
// and returns it.
TensorPtr record_scores(const SsdDims& d, const Inputs& in, size_t at, const char* op) {
    TensorPtr scores = make_on(Device::gpu, {size_mul(d.L, d.L, d.G, d.c, d.N), 1, 1, 1}, 2, DType::f32);
    u32(scores->numel(), op);
    SsdPush p = ssd_push(d, in, at, op);
    p.o = scores->address();
    record("ssd_chunks_scores", p, uint64_t(d.c * d.G * d.N), spans(in), {span(*scores)});
    return scores;
}

// The states passed along the chunks in place in p.planes [R, H, c, N] (ssd_pass.comp: an invocation
// per element of a walk's state, its walks the N sequences of H heads), from p.edge, the last to
// p.last: ssm_scan's chunked form (a decay per plane) and gated_linear_attn's (p.rows per plane).
void record_pass(const char* shader, const SsdPassPush& p, std::vector<vk::Range> reads,
                 std::vector<vk::Range> writes) {
    record(shader, p, groups(uint64_t(p.R) * p.H * p.N), reads, writes);
}

SsdPassPush ssd_pass_push(uint64_t planes, const TensorImpl& decay, uint64_t edge, uint64_t last, const SsdDims& d,
                          const char* op) {
    return {planes, decay.address(), edge, last, u32(d.plane(), op), u32(d.H, op), u32(d.c, op), u32(d.N, op), 1};
}

// Records the states at the chunks' starts into `starts` [D P, H, c, N] and the final states
// into `finals` (the forward's first two steps; u, log_decay, B, C, first at in[at..]); returns
// the chunks' decays A_q [H, c, N] they write.
TensorPtr record_start_states(const SsdDims& d, const Inputs& in, size_t at, const TensorImpl& starts, uint64_t finals,
                              std::vector<vk::Range> written, const char* op) {
    TensorPtr decay = make_on(Device::gpu, {d.H * d.c * d.N, 1, 1, 1}, 2, DType::f32);
    SsdPush p = ssd_push(d, in, at, op);
    p.o = starts.address(), p.per_chunk = decay->address();
    record("ssd_chunks_own_states", p, uint64_t(d.c * d.H * d.N), spans(in), {span(starts), span(*decay)});
    written.push_back(span(starts));
    record_pass("ssd_pass_forward", ssd_pass_push(starts.address(), *decay, in[at + 4]->address(), finals, d, op),
                {span(starts), span(*decay), span(*in[at + 4])}, written);
    return decay;
}

}  // namespace

void vk_ssd_chunks(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "ssd_chunks";
    const SsdDims d = ssd_dims(op, in, 0, attrs);
    u32(std::max(out.numel(), d.starts()), op);  // every index in the shaders is smaller
    check_ssd_loops(op, d);
    TensorPtr starts = make_on(Device::gpu, {d.starts(), 1, 1, 1}, 2, DType::f32);
    record_start_states(d, in, 0, *starts, out.address() + kFloat * d.y(), {span(out)}, op);
    TensorPtr scores = record_scores(d, in, 0, op);
    SsdPush p = ssd_push(d, in, 0, op);
    p.states = starts->address(), p.o = out.address(), p.scores = scores->address();
    std::vector<vk::Range> reads = spans(in);
    reads.push_back(span(*starts));
    reads.push_back(span(*scores));
    record("ssd_chunks_outputs", p, uint64_t(d.c * d.H * d.N), reads, {span(out)});
}

void vk_ssd_chunks_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "ssd_chunks_back";
    const SsdDims d = ssd_dims(op, in, 1, attrs);
    u32(std::max({out.numel(), in[0]->numel(), d.starts()}), op);
    const bool grouped = d.G != d.H;  // the heads' gB and gC summed per group by a pass of their own
    const int64_t per_head = size_mul(2, d.D, d.H, d.T, d.N);
    u32(per_head, op);
    check_ssd_loops(op, d);
    TensorPtr starts = make_on(Device::gpu, {d.starts(), 1, 1, 1}, 2, DType::f32);
    TensorPtr finals = make_on(Device::gpu, {d.finals(), 1, 1, 1}, 2, DType::f32);  // not read: the forward's
    TensorPtr decay = record_start_states(d, in, 1, *starts, finals->address(), {span(*finals)}, op);
    TensorPtr planes = make_on(Device::gpu, {d.starts(), 1, 1, 1}, 2, DType::f32);
    TensorPtr heads = grouped ? make_on(Device::gpu, {per_head, 1, 1, 1}, 2, DType::f32) : nullptr;
    const uint64_t g = in[0]->address(), g_finals = g + kFloat * d.y();
    const uint64_t gB = out.address() + kFloat * (d.y() + d.decays()), gfirst = gB + kFloat * 2 * d.inputs_bc();
    const uint64_t tiles = uint64_t(d.c * d.H * d.N);
    std::vector<vk::Range> reads = spans(in);
    SsdPush p = ssd_push(d, in, 1, op);
    p.g = g, p.o = planes->address();
    record("ssd_chunks_start_grads", p, tiles, reads, {span(*planes)});
    record_pass("ssd_pass_backward", ssd_pass_push(planes->address(), *decay, g_finals, gfirst, d, op),
                {span(*planes), span(*decay), span(*in[0])}, {span(*planes), span(out)});
    TensorPtr scores = record_scores(d, in, 1, op);
    TensorPtr pairs_g = make_on(Device::gpu, {size_mul(d.L, d.L, d.H, d.c, d.N), 1, 1, 1}, 2, DType::f32);
    u32(pairs_g->numel(), op);
    const int64_t per_token = size_mul(d.L, d.H, d.c, d.N);  // E's, and F's, terms [L, H, c, N]
    TensorPtr ends = make_on(Device::gpu, {size_mul(2, per_token), 1, 1, 1}, 2, DType::f32);  // E, then F
    u32(ends->numel(), op);
    p.states = starts->address(), p.aux = planes->address(), p.o = out.address(), p.bc = grouped ? heads->address() : gB;
    p.scores = scores->address(), p.pairs_g = pairs_g->address(), p.per_chunk = ends->address();
    reads.push_back(span(*planes));
    reads.push_back(span(*starts));
    reads.push_back(span(*scores));
    // four kernels that write apart, so that they share a level: GRADS_U gu, GRADS_PAIRS the pairs'
    // G K and glog_decay, STATE_GRADS_B (_C) the heads' terms of gB (gC) and E (F)
    const uint64_t glog = out.address() + kFloat * d.y();
    record("ssd_chunks_grads_u", p, tiles, reads, {{out.address(), glog}});
    record("ssd_chunks_grads_pairs", p, tiles, reads, {{glog, gB}, span(*pairs_g)});
    // the heads' gB, then gC, [D, H, T, N] each (in the output where each group is one head)
    const uint64_t bc_half = kFloat * uint64_t(per_head / 2);
    const uint64_t ends_half = kFloat * uint64_t(per_token);
    record("ssd_chunks_state_grads_b", p, tiles, reads,
           {{p.bc, p.bc + bc_half}, {ends->address(), ends->address() + ends_half}});
    record("ssd_chunks_state_grads_c", p, tiles, reads,
           {{p.bc + bc_half, p.bc + 2 * bc_half}, {ends->address() + ends_half, ends->address() + 2 * ends_half}});
    if (grouped) {
        const SsdPassPush sum{heads->address(), 0, gB, 0, u32(d.D, op), u32(d.H, op), u32(d.G, op),
                              u32(d.T * d.N, op), 1};
        record("ssd_pass_group_sum", sum, groups(uint64_t(2 * d.inputs_bc())), {span(*heads)}, {span(out)});
    }
    // the terms of gB and gC through the pairs, once per group, added to the heads' sums; the
    // heads' terms of glog_decay through E and F added to GRADS_PAIRS'
    p.bc = gB;
    std::vector<vk::Range> pair_reads = spans(in);
    pair_reads.push_back(span(*pairs_g));
    pair_reads.push_back(span(*ends));
    pair_reads.push_back(span(out));
    record("ssd_chunks_pair_grads", p, uint64_t(d.c * d.G * d.N), pair_reads, {span(out)});
}


// ---- gated linear attention in chunks (gla_chunks): every chunk's work at once, the states passed
// along the chunks by ssd_pass.comp with a decay per key channel ----------------------------------

namespace {

struct GlaChunkSizes {
    int64_t S, H, T, N, L, c;  // T tokens per sequence, c chunks of L tokens each (the last may be shorter)
    int64_t y() const { return size_mul(S, H, T, N); }
    int64_t states() const { return size_mul(S, S, H, N); }
    int64_t planes() const { return size_mul(c, H, N); }
    int64_t plane_states() const { return size_mul(S, S, planes()); }
    int64_t pairs() const { return size_mul(L, L, planes()); }
    int64_t state_blocks() const { return size_mul((S + 63) / 64, (S + 63) / 64, planes()); }  // 64 x 64 each
    int64_t channel_blocks() const { return size_mul((S + 63) / 64, planes()); }
    // Scratch floats (gla_chunks.comp): decay, E, F and A; the backward's dA, W, ZY and ZV besides.
    int64_t scratch(bool backward) const {
        const int64_t forward = size_add(size_mul(S, planes()), size_mul(2, y()), pairs());
        return backward ? size_add(forward, pairs(), size_mul(S, planes()), size_mul(2, y())) : forward;
    }
};

// The sizes of gla_chunks' inputs k [S, H, T N] and state [S*S*H, N] (the shape rule checked them)
// and its chunk length, as cpu_gla_chunks.cpp takes it.
GlaChunkSizes gla_chunk_sizes(const TensorImpl& k, const TensorImpl& state, const OpAttrs& attrs) {
    const int64_t N = state.ne[1], T = k.ne[2] / N;
    const int64_t L = std::min(attrs.ints[0], std::max<int64_t>(1, T));
    return {k.ne[0], k.ne[1], T, N, L, (T + L - 1) / L};
}

struct GlaPush {
    uint64_t k, v, q, lg, g, states, planes, scratch, o;
    uint32_t S, H, T, N, L, c;
    float scale;
};

GlaPush gla_push(const GlaChunkSizes& z, const Inputs& in, size_t first, const OpAttrs& attrs, const char* op) {
    GlaPush p{};
    p.k = in[first]->address(), p.v = in[first + 1]->address(), p.q = in[first + 2]->address();
    p.lg = in[first + 3]->address();
    p.S = u32(z.S, op), p.H = u32(z.H, op), p.T = u32(z.T, op), p.N = u32(z.N, op), p.L = u32(z.L, op);
    p.c = u32(z.c, op), p.scale = float(attrs.floats[0]);
    return p;
}

constexpr int64_t kGlaMaxChunk = 64;  // gla_chunks.comp: LMAX

// Refuses chunks longer than the shaders stage, and invocations whose loops the device would cut
// short (GRADS' are the longest: the pairs s < x <= t).
void check_gla_chunks(const char* op, const GlaChunkSizes& z) {
    if (z.L > kGlaMaxChunk)
        throw std::invalid_argument(op_err(op, "chunks of at most " + std::to_string(kGlaMaxChunk) +
                                                   " tokens on the GPU, got " + std::to_string(z.L) +
                                                   " (pass a smaller chunk_size, or run it on the CPU)"));
    const double L = double(z.L), S = double(z.S), blocks = std::ceil(S / 16);
    const double pairs = blocks * (4 + 16 * (L + 16)), grads = L * L + 5 * L + S;
    const double states = std::max(L, S) + std::ceil(S / 64) * blocks * (4 + 16 * 17);
    const double products = 260.0 * std::ceil(std::max(L, S) / 16);  // staged_product.glsl's, per 16 terms
    check_loop_budget(op, z.L, "tokens per chunk", kLoopMargin * std::max({pairs, grads, states, products}));
}

// ssd_pass.comp's push for the states passed along each (sequence, head)'s chunks in place in
// `planes` (its walks the (sequence, head) pairs), from `edge`, the last to `last`; the decays the
// scratch's first, a row of S per plane.
SsdPassPush gla_pass_push(const GlaChunkSizes& z, uint64_t planes, const TensorImpl& scratch, uint64_t edge,
                          uint64_t last, const char* op) {
    return {planes, scratch.address(), edge, last, u32(z.S * z.S, op), 1, u32(z.c, op), u32(z.H * z.N, op),
            u32(z.S, op)};
}

}  // namespace

void vk_gla_chunks(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "gla_chunks";
    const GlaChunkSizes z = gla_chunk_sizes(*in[0], *in[4], attrs);
    check_gla_chunks(op, z);
    TensorPtr scratch = make_on(Device::gpu, {z.scratch(false), 1, 1, 1}, 2, DType::f32);
    u32(std::max(out.numel(), scratch->numel()), op);  // every index in the shader is smaller
    const uint64_t finals = out.address() + kFloat * z.y(), starts = finals + kFloat * z.states();
    GlaPush p = gla_push(z, in, 0, attrs, op);
    p.states = starts, p.scratch = scratch->address(), p.o = out.address();
    std::vector<vk::Range> reads = spans(in);
    record("gla_chunks_decays", p, groups(uint64_t(z.S * z.planes())), reads, {span(*scratch)});
    record("gla_chunks_pairs", p, uint64_t(z.planes()), reads, {span(*scratch)});
    reads.push_back(span(*scratch));
    record("gla_chunks_own_states", p, uint64_t(z.state_blocks()), reads, {span(out)});
    record_pass("ssd_pass_forward", gla_pass_push(z, starts, *scratch, in[4]->address(), finals, op),
                {span(out), span(*scratch), span(*in[4])}, {span(out)});
    reads.push_back(span(out));
    record("gla_chunks_state_reads", p, uint64_t(z.channel_blocks()), reads, {span(out)});
    record("gla_chunks_outputs", p, groups(uint64_t(z.y())), reads, {span(out)});
}

void vk_gla_chunks_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "gla_chunks_back";
    const GlaChunkSizes z = gla_chunk_sizes(*in[1], *in[5], attrs);
    check_gla_chunks(op, z);
    TensorPtr scratch = make_on(Device::gpu, {z.scratch(true), 1, 1, 1}, 2, DType::f32);
    TensorPtr planes = make_on(Device::gpu, {z.plane_states(), 1, 1, 1}, 2, DType::f32);
    u32(std::max({out.numel(), in[0]->numel(), in[6]->numel(), scratch->numel()}), op);
    const uint64_t g = in[0]->address(), fwd = in[6]->address();
    GlaPush p = gla_push(z, in, 1, attrs, op);
    p.g = g, p.states = fwd + kFloat * (z.y() + z.states()), p.planes = planes->address();
    p.scratch = scratch->address(), p.o = out.address();
    std::vector<vk::Range> reads = spans(in);
    record("gla_chunks_decays", p, groups(uint64_t(z.S * z.planes())), reads, {span(*scratch)});
    record("gla_chunks_pairs_backward", p, uint64_t(z.planes()), reads, {span(*scratch)});
    reads.push_back(span(*scratch));
    record("gla_chunks_start_grads", p, uint64_t(z.state_blocks()), reads, {span(*planes)});
    record_pass("ssd_pass_backward",
                gla_pass_push(z, planes->address(), *scratch, g + kFloat * z.y(), out.address() + kFloat * 4 * z.y(), op),
                {span(*planes), span(*scratch), span(*in[0])}, {span(*planes), span(out)});
    reads.push_back(span(*planes));
    record("gla_chunks_state_products", p, uint64_t(z.planes()), reads, {span(*scratch)});
    record("gla_chunks_state_reads_backward", p, uint64_t(z.channel_blocks()), reads, {span(out)});
    reads.push_back(span(out));
    record("gla_chunks_grads", p, groups(uint64_t(z.y())), reads, {span(out)});
}

}  // namespace rk
