// The Vulkan column of the op table for sequences: the state-space layers (ssm_conv, Mamba's
// selective scan, which kernel runs the scan where) and the matrix-state recurrences (RWKV-6,
// gated linear attention, RWKV-7). Their chunked forms: vk_chunk_kernels.cpp.
#include <algorithm>
#include <cmath>

#include "kernel_util.hpp"
#include "recurrence.hpp"
#include "ssm_scan.hpp"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"
#include "vulkan/vk_sequence_util.hpp"

namespace rk {

using vk::check_loop_budget;
using vk::ctx;
using vk::groups;
using vk::kGroup;
using vk::kLoopMargin;
using vk::record;
using vk::span;
using vk::spans;
using vk::u32;

// ---- state-space layers ------------------------------------------------------------------

namespace {

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

}  // namespace rk
