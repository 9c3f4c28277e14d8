// The Vulkan column of the op table for sequences: the state-space layers (ssm_conv, Mamba's
// selective scan, which kernel runs the scan where) and the matrix-state recurrences (RWKV-6,
// gated linear attention, RWKV-7), with the guard against drivers that cut long loops short.
#include <algorithm>
#include <cmath>

#include "kernel_util.hpp"
#include "recurrence.hpp"
#include "ssd_chunks.hpp"
#include "ssm_scan.hpp"
#include "staged_arrays.def"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"

namespace rk {

using vk::ctx;
using vk::groups;
using vk::kGroup;
using vk::record;
using vk::span;
using vk::u32;

namespace {

// The counts of loops in the recurrences' shaders below come from reading them; lavapipe was
// seen to count about 1.2 times as many (rwkv_wkv7 at head size 64 went wrong from about 950
// tokens, where 59 per token were counted), so they are doubled.
constexpr double kLoopMargin = 2.0;

// Refuses a dispatch whose invocations would run more loop iterations than the device lets a
// shader invocation run before it ends its loops early (lavapipe: Limits::loop_iterations), which
// would give wrong numbers without an error. `iterations` bounds one invocation's from above.
void check_loop_budget(const char* op, int64_t count, const char* unit, double iterations) {
    const uint64_t budget = ctx().limits().loop_iterations;
    if (budget == 0 || iterations <= double(budget)) return;
    throw std::runtime_error(std::string(op) + ": " + std::to_string(count) + " " + unit + " need about " +
                             std::to_string(int64_t(iterations)) + " loop iterations in one shader invocation; " +
                             ctx().device_name() + " ends a shader's loops after " + std::to_string(budget) +
                             " and would give wrong numbers. Run it on the CPU (rc.device('cpu')), or in shorter "
                             "pieces carrying the state");
}

// The memory ranges of an op's inputs: what its dispatch reads.
std::vector<vk::Range> spans(const Inputs& in) {
    std::vector<vk::Range> reads;
    for (const TensorPtr& t : in) reads.push_back(span(*t));
    return reads;
}

// ---- state-space layers ------------------------------------------------------------------

struct SsmConvPush {
    uint64_t a, b, o;
    uint32_t d_conv, d_inner, n_t, n_s, n;
};

// ssm_conv and its backward helpers: (a, b) as ssm_conv.comp names them, dims from the output's
// shape rule (the CPU kernels check the same shapes).
void ssm_conv_op(const char* variant, const TensorImpl& a, const TensorImpl& b, TensorImpl& out, int64_t d_conv,
                 int64_t d_inner, int64_t n_t, int64_t n_s) {
    SsmConvPush p{a.address(), b.address(), out.address(), u32(d_conv, variant), u32(d_inner, variant),
                  u32(n_t, variant), u32(n_s, variant), u32(out.numel(), variant)};
    record(std::string("ssm_conv_") + variant, p, groups(p.n), {span(a), span(b)}, {span(out)});
}

}  // namespace

void vk_ssm_conv(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &sx = *in[0], &c = *in[1];  // out [d_inner, n_t, n_s]
    ssm_conv_op("forward", sx, c, out, c.ne[0], c.ne[1], out.ne[1], out.ne[2]);
}

void vk_ssm_conv_sx_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &c = *in[1];
    ssm_conv_op("back_sx", g, c, out, c.ne[0], g.ne[0], g.ne[1], g.ne[2]);
}

void vk_ssm_conv_c_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &sx = *in[1];
    ssm_conv_op("back_c", g, sx, out, out.ne[0], g.ne[0], g.ne[1], g.ne[2]);
}

namespace {

uint64_t next_pow2(uint64_t n) {
    uint64_t p = 1;
    while (p < n) p *= 2;
    return p;
}

struct SsmScanPush {
    uint64_t s, x, dt, a, b, c, ids, g, o;
    uint32_t d_state, head_dim, n_head, n_tok, n_seqs, n_group, a_rows, n_rs;
    uint32_t chunk;           // tokens between the backward pass's checkpoints
    uint32_t split[2];        // ssm_scan.comp: lanes, slot_shift; ssm_scan_tiled.comp: n_blocks, p_blocks
    uint32_t scratch_stride;  // ssm_scan_tiled.comp: scratch floats per (sequence, head)
};

// How a scan runs: the shader, the push constants that depend on it, its workgroups per
// (sequence, head), and a bound of the loop iterations one of its invocations runs (each
// shader's loops whose trip counts are not constants, per token, from its code; generous, so
// that check_loop_budget errs on the side of refusing).
struct ScanPlan {
    std::string shader;
    int64_t chunk = 0, split[2] = {0, 0}, scratch_stride = 0;
    uint64_t groups_per_task = 1;
    double loop_iterations = 0;
};

// ssm_scan_rows.comp (forward): two rows per subgroup, each lane with LANE_STATES states of
// them, a variant for each power of two up to 32; 0 where it cannot run.
constexpr int64_t kRowsPerSubgroup = 2, kMaxLaneStates = 32;

int64_t lane_states(const ScanDims& d) {
    const vk::Limits& limits = ctx().limits();
    const uint32_t lanes = limits.subgroup_size;
    if (!limits.subgroup_arithmetic || lanes == 0 || kGroup % lanes != 0) return 0;
    const int64_t states = int64_t(next_pow2(uint64_t((d.d_state + lanes - 1) / lanes)));
    return states <= kMaxLaneStates ? states : 0;
}

ScanPlan rows_plan(const ScanDims& d, int64_t states) {
    ScanPlan plan;
    plan.shader = "ssm_scan_rows_" + std::to_string(states);
    const int64_t rows = kRowsPerSubgroup * int64_t(kGroup / ctx().limits().subgroup_size);
    plan.groups_per_task = uint64_t((d.head_dim + rows - 1) / rows);
    plan.loop_iterations = double(d.n_tok) + 1.0;  // the token loop
    return plan;
}

// ssm_scan_tiled.comp's tiles and stages (the shader's constants): 4 states of 8 rows per
// invocation; a token's B, C, x, dy and dt take at most 512 floats of a stage (2048 floats and
// 8 tokens, or 5888 floats and 24 tokens in the LARGE_STAGE variant, for 48 KiB of shared
// memory); 2560 floats of row sums.
constexpr int64_t kStageWidth = 512, kBackwardStates = 4, kBackwardRows = 8, kRowSums = 2560;
constexpr int64_t kSmallStage = 2048, kSmallStageTokens = 8, kLargeStage = 5888, kLargeStageTokens = 24;

// The tiled backward, or an empty shader where a head's tiles do not fit it. It checkpoints
// every chunk-th token in the scratch the CPU's layout sets aside (ScanDims::scratch_per_task):
// as many checkpoints as it holds, so chunks are short.
ScanPlan tiled_backward_plan(const ScanDims& d) {
    ScanPlan plan;
    const int64_t n_blocks = (d.d_state + kBackwardStates - 1) / kBackwardStates;
    const int64_t p_blocks = (d.head_dim + kBackwardRows - 1) / kBackwardRows;
    const int64_t width = 2 * (d.d_state + d.head_dim + 1);  // B, C, x, dy, dt and its slope
    // the tiles pay off from 8 rows per head (Mamba-1's head_dim 1 stays on ssm_scan.comp)
    if (d.head_dim < 8 || n_blocks * p_blocks > int64_t(kGroup) ||
        p_blocks * kBackwardRows * (n_blocks + 1) > kRowSums || width > kStageWidth)
        return plan;
    const bool large = ctx().limits().max_shared_memory >= 48 * 1024;
    const int64_t slots = d.scratch_per_task() / d.state_size();
    plan.shader = large ? "ssm_scan_tiled_backward_large" : "ssm_scan_tiled_backward";
    plan.chunk = (d.n_tok + slots - 1) / slots;
    plan.split[0] = n_blocks;
    plan.split[1] = p_blocks;
    plan.scratch_stride = d.scratch_per_task();
    // per token: the two walks' token loops, the recomputed steps, the sums over rows, states and
    // gdt's shares, the walks over a chunk's earlier stages
    const int64_t stage = std::min(large ? kLargeStageTokens : kSmallStageTokens, (large ? kLargeStage : kSmallStage) / width);
    const int64_t stages_per_chunk = (plan.chunk + stage - 1) / stage;
    plan.loop_iterations = double(d.n_tok) * (2.0 + double(stage + p_blocks + n_blocks) +
                                              double((d.head_dim + 255) / 256) + 32.0 + double(stages_per_chunk));
    return plan;
}

// ssm_scan.comp: `lanes` invocations per row p of a head's state, each with 2^slot_shift of the
// row's states, in registers or (the _memory variants) in device memory when more than they hold.
ScanPlan split_plan(const ScanDims& d, bool backward) {
    ScanPlan plan;
    const int64_t rows = std::min<int64_t>(kGroup, int64_t(next_pow2(uint64_t(d.head_dim))));
    const int64_t lanes = int64_t(kGroup) / rows;
    int64_t slot_shift = 0;  // slots per row: a power of two covering d_state / lanes
    while ((int64_t(1) << slot_shift) * lanes < d.d_state) ++slot_shift;
    constexpr int64_t kMaxOwned = 64, kStage = 4096;  // ssm_scan.comp's registers per invocation, staged floats
    const int64_t owned = (d.head_dim + rows - 1) / rows * (int64_t(1) << slot_shift);
    const bool in_memory = owned > kMaxOwned || 2 * (d.d_state + d.head_dim) > kStage;
    plan.shader = std::string(backward ? "ssm_scan_backward" : "ssm_scan_forward") + (in_memory ? "_memory" : "");
    plan.chunk = d.chunk();
    plan.split[0] = lanes;
    plan.split[1] = slot_shift;
    // per token: up to four passes over an invocation's 64 owned elements, the backward's sums
    // over head_dim and d_state, the reduction and stage loops
    plan.loop_iterations = double(d.n_tok) * (backward ? 4.0 * 64 + double(d.d_state + d.head_dim) + 16.0 : 80.0);
    return plan;
}

ScanPlan scan_plan(const ScanDims& d, bool backward) {
    if (!backward) {
        const int64_t states = lane_states(d);
        if (states > 0) return rows_plan(d, states);
    } else {
        ScanPlan tiled = tiled_backward_plan(d);
        if (!tiled.shader.empty()) return tiled;
    }
    return split_plan(d, backward);
}

}  // namespace

std::string vk::scan_kernel(const ScanDims& d, bool backward) { return scan_plan(d, backward).shader; }

namespace {

// The plan's shader over (sequence, head) tasks; each shader's header says how the state is
// spread over its invocations.
void ssm_scan_op(const char* pass, const Inputs& in, size_t first, const TensorImpl* g, TensorImpl& out) {
    const ScanDims d = scan_dims(pass, in, first);
    u32(out.numel(), pass);  // the shader indexes the whole output with 32-bit offsets
    const ScanPlan plan = scan_plan(d, g != nullptr);
    check_loop_budget(pass, d.n_tok, "tokens per sequence", plan.loop_iterations);
    const TensorImpl &s = *in[first], &x = *in[first + 1], &dt = *in[first + 2], &a = *in[first + 3],
                     &b = *in[first + 4], &c = *in[first + 5], &ids = *in[first + 6];
    const SsmScanPush p{s.address(), x.address(), dt.address(), a.address(), b.address(), c.address(), ids.address(),
                        g ? g->address() : 0, out.address(),
                        u32(d.d_state, pass), u32(d.head_dim, pass), u32(d.n_head, pass), u32(d.n_tok, pass),
                        u32(d.n_seqs, pass), u32(d.n_group, pass), u32(d.a_rows, pass), u32(d.n_rs, pass),
                        u32(plan.chunk, pass), {u32(plan.split[0], pass), u32(plan.split[1], pass)},
                        u32(plan.scratch_stride, pass)};
    std::vector<vk::Range> reads{span(s), span(x), span(dt), span(a), span(b), span(c), span(ids)};
    if (g) reads.push_back(span(*g));
    record(plan.shader, p, uint64_t(d.tasks()) * plan.groups_per_task, reads, {span(out)});
}

}  // namespace

void vk_ssm_scan(const Inputs& in, const OpAttrs&, TensorImpl& out) { ssm_scan_op("ssm_scan", in, 0, nullptr, out); }

void vk_ssm_scan_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    ssm_scan_op("ssm_scan_back", in, 1, in[0].get(), out);
}

namespace {

// ---- matrix-state recurrences (RWKV-6, gated linear attention) ---------------------------------

struct RecurrencePush {
    uint64_t k, v, r, w, u, state, g, o;
    uint32_t S, H, T, n_seqs, n_chunks;
    uint32_t off_bonus, off_state, off_scratch;
    float scale;
};

// recurrence.comp's loops per token, each at its largest trip count: the state update over the
// owned rows and columns, the sums over 64-wide tiles with their 16 lanes; the backward walks the
// state twice and sums four quantities.
double recurrence_loop_iterations(int64_t S, int64_t tokens, bool backward) {
    const double per = double((S + 15) / 16), tiles = double((S + 63) / 64), lanes = double(std::min<int64_t>(S, 16));
    const double forward = 1.0 + per + per * per + tiles * (1.0 + per + per * per + lanes);
    return kLoopMargin * double(tokens) * (backward ? 4.0 * forward + 8.0 * tiles * lanes : forward);
}

// recurrence_registers.comp and wkv7_registers.comp: head sizes up to kRecurrenceRegisterRows, a
// quad of invocations per row or column of the state (the device's quad operations sum it). They
// unroll their loops over a row or column: per token the forward iterates once, and loads a
// stage's tokens in at most one more iteration per token; the backward walks three times (its
// forward, the chunk's recomputed states, the walk back), its stage loads at most one more, plus
// a pass per chunk.
constexpr int64_t kRecurrenceRegisterRows = 64;  // MAX_S there

bool registers_fit(int64_t S) { return S <= kRecurrenceRegisterRows && ctx().limits().subgroup_quad; }

double recurrence_registers_loop_iterations(int64_t tokens, bool backward) {
    const double chunks = std::ceil(double(tokens) / double(kRecurrenceChunk));
    return kLoopMargin * (backward ? 4.0 * double(tokens) + chunks : 2.0 * double(tokens));
}

// One workgroup per (sequence, head) of recurrence.comp. `in` holds (k, v, r-or-q, w, state)
// from position `first`, u is WKV6's bonus (null for GLA), g the upstream gradient (backward).
void recurrence(const char* kind, bool backward, const Inputs& in, size_t first, const TensorImpl* u,
                const TensorImpl* g, float scale, TensorImpl& out) {
    const TensorImpl &k = *in[first], &v = *in[first + 1], &r = *in[first + 2], &w = *in[first + 3],
                     &state = *in[first + 4];
    const RecurrenceDims d = recurrence_sizes(k, state);
    const BackLayout l = back_layout(d, u != nullptr);
    RecurrencePush p{k.address(), v.address(), r.address(), w.address(), u ? u->address() : 0, state.address(),
                     g ? g->address() : 0, out.address()};
    p.S = u32(d.S, kind);
    p.H = u32(d.H, kind);
    p.T = u32(d.T, kind);
    p.n_seqs = u32(d.n_seqs, kind);
    p.n_chunks = u32(d.n_chunks(), kind);
    u32(out.numel(), kind);  // every index of the output fits the shader's 32 bits
    p.off_bonus = backward ? u32(l.bonus, kind) : 0;
    p.off_state = backward ? u32(l.state, kind) : 0;
    p.off_scratch = backward ? u32(l.scratch, kind) : 0;
    p.scale = scale;
    std::vector<vk::Range> reads{span(k), span(v), span(r), span(w), span(state)};
    if (u) reads.push_back(span(*u));
    if (g) reads.push_back(span(*g));
    if (backward) reads.push_back(span(out));  // the stored states are read back
    // S <= 64: recurrence_registers.comp, a row or column of the state per quad, in registers
    const bool registers = registers_fit(d.S);
    const std::string shader = std::string("recurrence_") + kind + (backward ? "_backward" : "_forward") +
                               (registers ? "_registers" : "");
    const int64_t tokens = d.T / d.n_seqs;
    check_loop_budget(kind, tokens, "tokens per sequence",
                      registers ? recurrence_registers_loop_iterations(tokens, backward)
                                : recurrence_loop_iterations(d.S, tokens, backward));
    record(shader, p, uint64_t(d.n_seqs * d.H), reads, {span(out)});
}

}  // namespace

void vk_rwkv_wkv6(const Inputs& in, const OpAttrs&, TensorImpl& out) {  // (k, v, r, tf, td, state)
    Inputs ordered{in[0], in[1], in[2], in[4], in[5]};
    recurrence("wkv6", false, ordered, 0, in[3].get(), nullptr, 1.0f, out);
}

void vk_rwkv_wkv6_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {  // (g, k, v, r, tf, td, state)
    Inputs ordered{in[1], in[2], in[3], in[5], in[6]};
    recurrence("wkv6", true, ordered, 0, in[4].get(), in[0].get(), 1.0f, out);
}

void vk_gated_linear_attn(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {  // (k, v, q, g, state)
    recurrence("gla", false, in, 0, nullptr, nullptr, float(attrs.floats[0]), out);
}

void vk_gated_linear_attn_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    recurrence("gla", true, in, 1, nullptr, in[0].get(), float(attrs.floats[0]), out);
}

// ---- RWKV-7 ----------------------------------------------------------------------------------

namespace {

// wkv7.comp's loops per token, each at its largest trip count: a row or column sum (its passes,
// each with a part of the row and the parts' sum) and an elementwise pass over the state. The
// forward has two sums and a pass; the backward walks the state twice (a sum and a pass each) and
// then has four sums and two passes.
double wkv7_loop_iterations(int64_t S, int64_t tokens, bool backward) {
    const double ways = double(std::max<int64_t>(1, 256 / S)), lines = 256.0 / ways;
    const double sum = std::ceil(double(S) / lines) * (1.0 + std::ceil(double(S) / ways) + ways);
    const double pass = std::ceil(double(S * S) / 256.0);
    return kLoopMargin * double(tokens) * (backward ? 2.0 + 6.0 * sum + 4.0 * pass : 1.0 + 2.0 * sum + pass);
}

// Which kernel runs a head size (wkv7_registers.comp: as recurrence_registers.comp), and its loop
// count (refused where the device would cut it short).
const char* wkv7_kernel(const char* op, int64_t S, int64_t tokens, bool backward) {
    const bool registers = registers_fit(S);
    check_loop_budget(op, tokens, "tokens per sequence",
                      registers ? recurrence_registers_loop_iterations(tokens, backward)
                                : wkv7_loop_iterations(S, tokens, backward));
    if (registers) return backward ? "wkv7_registers_backward" : "wkv7_registers_forward";
    return backward ? "wkv7_backward" : "wkv7_forward";
}

struct Wkv7Push {
    uint64_t r, w, k, v, a, b, state, o;
    uint32_t S, H, T, n_seqs;
};

struct Wkv7BackPush {
    uint64_t r, w, k, v, a, b, state, o, g, scratch;
    uint32_t S, H, T, n_seqs, chunk;
};

}  // namespace

// rwkv_wkv7 and its backward: one workgroup per (sequence, head); shapes checked by the shape rule.
void vk_rwkv_wkv7(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &r = *in[0], &state = *in[6];
    Wkv7Push p{r.address(), in[1]->address(), in[2]->address(), in[3]->address(), in[4]->address(),
               in[5]->address(), state.address(), out.address(), u32(r.ne[0], "rwkv_wkv7"), u32(r.ne[1], "rwkv_wkv7"),
               u32(r.ne[2], "rwkv_wkv7"), u32(state.ne[1], "rwkv_wkv7")};
    u32(out.numel(), "rwkv_wkv7");
    const char* kernel = wkv7_kernel("rwkv_wkv7", r.ne[0], r.ne[2] / state.ne[1], false);
    const std::vector<vk::Range> reads = spans(in);
    record(kernel, p, uint64_t(p.H) * p.n_seqs, reads, {span(out)});
}

void vk_rwkv_wkv7_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &g = *in[0], &r = *in[1], &state = *in[7];
    const int64_t S = r.ne[0], H = r.ne[1], T = r.ne[2], n_seqs = state.ne[1];
    // the scratch (ops.def): the output's columns after the gradients
    const uint64_t scratch = out.address() + uint64_t(S * H * (6 * T + S * n_seqs)) * sizeof(float);
    Wkv7BackPush p{r.address(), in[2]->address(), in[3]->address(), in[4]->address(), in[5]->address(),
                   in[6]->address(), state.address(), out.address(), g.address(), scratch,
                   u32(S, "rwkv_wkv7_back"), u32(H, "rwkv_wkv7_back"), u32(T, "rwkv_wkv7_back"),
                   u32(n_seqs, "rwkv_wkv7_back"), uint32_t(kRecurrenceChunk)};
    u32(out.numel(), "rwkv_wkv7_back");
    const char* kernel = wkv7_kernel("rwkv_wkv7_back", S, T / n_seqs, true);
    const std::vector<vk::Range> reads = spans(in);
    record(kernel, p, uint64_t(H) * n_seqs, reads, {span(out)});
}

// ---- RWKV-7's chunked form: what each chunk computes from its own tokens -----------------------

namespace {

struct ChunkTermsPush {
    uint64_t r, k, v, a, b, log_decay, o, pairs, columns, g, fwd;
    uint32_t S, L, B, with_q, H, n_tok, chunks;
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
    u32(size_add(size_mul(7, S, L, B), size_mul(2, L, L, B)), op);
    u32(size_mul(4, L, L, B), op);
    ChunkTermsPush p{};
    p.r = r.address(), p.k = in[first + 1]->address(), p.v = in[first + 2]->address();
    p.a = in[first + 3]->address(), p.b = in[first + 4]->address(), p.log_decay = in[first + 5]->address();
    p.S = u32(S, op), p.L = u32(L, op), p.B = u32(B, op);
    p.H = u32(H, op), p.n_tok = u32(n_tok, op), p.chunks = u32(chunks, op);
    return p;
}

}  // namespace

// wkv7_chunk_terms: PAIRS (a workgroup per chunk), then SOLVE (an invocation per chunk and column).
void vk_wkv7_chunk_terms(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "wkv7_chunk_terms";
    ChunkTermsPush p = chunk_terms_push(op, in, 0, attrs);
    TensorPtr pairs = make_on(Device::gpu, {size_mul(2, p.L, p.L, p.B), 1, 1, 1}, 2, DType::f32);
    p.o = out.address(), p.pairs = pairs->address(), p.with_q = 1;
    record("wkv7_chunk_terms_pairs", p, p.B, spans(in), {span(out), span(*pairs)});
    std::vector<vk::Range> reads = spans(in);
    reads.push_back(span(*pairs));
    record("wkv7_chunk_terms_solve", p, groups(uint64_t(2) * p.S * p.B), reads, {span(out)});
}

// wkv7_chunk_terms_back: PAIRS (P_ab, P_ak again), BACK_SOLVE, BACK_PAIRS, BACK_CHANNELS.
void vk_wkv7_chunk_terms_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const char* op = "wkv7_chunk_terms_back";
    ChunkTermsPush p = chunk_terms_push(op, in, 1, attrs);
    TensorPtr pairs = make_on(Device::gpu, {size_mul(4, p.L, p.L, p.B), 1, 1, 1}, 2, DType::f32);
    TensorPtr columns = make_on(Device::gpu, {size_mul(3, p.S, p.L, p.B), 1, 1, 1}, 2, DType::f32);
    p.o = out.address(), p.pairs = pairs->address(), p.columns = columns->address();
    p.g = in[0]->address(), p.fwd = in[7]->address(), p.with_q = 0;
    std::vector<vk::Range> reads = spans(in);
    record("wkv7_chunk_terms_pairs", p, p.B, reads, {span(*pairs)});
    reads.push_back(span(*pairs));
    record("wkv7_chunk_terms_back_solve", p, groups(uint64_t(2) * p.S * p.B), reads, {span(*columns), span(out)});
    reads.push_back(span(*columns));
    record("wkv7_chunk_terms_back_pairs", p, p.B, reads, {span(*pairs)});
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
// (the block's T and V): 28 KiB, within lavapipe's 32 (staged_arrays.def).
constexpr int64_t kStagedBlockColumns = RK_WKV7_FORWARD_BLOCK_COLUMNS, kStagedInputFloats = RK_WKV7_FORWARD_INPUTS,
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
                  kWalkStagedInputFloats = RK_WKV7_WALK_STAGED_INPUTS,
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
    return (L + 1) * S <= kWalkStagedInputFloats && S * (kWalkStagedColumns + 1) <= kWalkStagedStateFloats &&
           (L + 1) * kWalkStagedColumns <= kWalkDTFloats &&
           shared_memory_holds(3 * kWalkStagedInputFloats + kWalkStagedStateFloats + kWalkDTFloats);
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
