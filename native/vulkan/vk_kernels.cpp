// The Vulkan column of the op table: for each op, the shader variant it records and the push
// constants it passes (each struct mirrors the push_constant block of its shader, std430).
#include <algorithm>
#include <climits>
#include <cstring>

#include "backend.hpp"
#include "kernel_util.hpp"
#include "random.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"

namespace rk {
namespace {

constexpr uint64_t kGroup = 256;  // local_size_x of every shader

vk::Context& ctx() {
    std::string why;
    vk::Context* c = vk::Context::get(&why);
    if (!c) throw std::runtime_error("no GPU: " + why);
    return *c;
}

uint64_t groups(uint64_t n) { return (n + kGroup - 1) / kGroup; }

vk::Range span(const TensorImpl& t) { return {t.address(), t.address() + (t.nbytes() + 3) / 4 * 4}; }

uint32_t u32(int64_t n, const char* what) {
    if (n < 0 || n > int64_t(UINT32_MAX))
        throw std::invalid_argument(std::string(what) + ": a size exceeds the GPU kernels' 32-bit indexing");
    return uint32_t(n);
}

void shape4(const Shape& ne, uint32_t out[4], const char* what) {
    for (int d = 0; d < kMaxDims; ++d) out[d] = u32(ne[d], what);
}

template <typename Push>
void record(const std::string& shader, const Push& push, uint64_t n_groups, std::vector<vk::Range> reads,
            std::vector<vk::Range> writes, uint32_t groups_z = 1) {
    static_assert(sizeof(Push) <= 128, "push constants are limited to 128 bytes");
    ctx().dispatch(shader, &push, sizeof(Push), n_groups, reads, writes, groups_z);
}

// ---- elementwise -----------------------------------------------------------------------

struct BinaryPush {
    uint64_t a, b, o;
    uint32_t ne[4], sa[4], sb[4];
    uint32_t n;
    float p0, p1;
};

void binary(const char* variant, const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &a = *in[0], &b = *in[1];
    BinaryPush p{a.address(), b.address(), out.address()};
    shape4(out.ne, p.ne, variant);
    const Shape sa = broadcast_strides(a, out.ne), sb = broadcast_strides(b, out.ne);
    for (int d = 0; d < kMaxDims; ++d) p.sa[d] = u32(sa[d], variant), p.sb[d] = u32(sb[d], variant);
    p.n = u32(out.numel(), variant);
    p.p0 = attrs.floats.size() > 0 ? float(attrs.floats[0]) : 0.0f;
    p.p1 = attrs.floats.size() > 1 ? float(attrs.floats[1]) : 0.0f;
    record(std::string("binary_") + variant, p, groups(p.n), {span(a), span(b)}, {span(out)});
}

struct UnaryPush {
    uint64_t x, o;
    uint32_t n;
    float p0, p1;
};

void unary(const char* variant, const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    UnaryPush p{in[0]->address(), out.address(), u32(out.numel(), variant)};
    p.p0 = attrs.floats.size() > 0 ? float(attrs.floats[0]) : 0.0f;
    p.p1 = attrs.floats.size() > 1 ? float(attrs.floats[1]) : 0.0f;
    record(std::string("unary_") + variant, p, groups(p.n), {span(*in[0])}, {span(out)});
}

struct CastPush {
    uint64_t x, o;
    uint32_t n;
};

void cast_into(const TensorImpl& x, TensorImpl& out) {
    if (x.dtype == out.dtype) {
        ctx().copy(x, out);
        return;
    }
    auto one_step = [](DType from, DType to) -> const char* {
        if (from == DType::f32 && to == DType::f16) return "cast_f32_to_f16";
        if (from == DType::f16 && to == DType::f32) return "cast_f16_to_f32";
        if (from == DType::f32 && to == DType::i32) return "cast_f32_to_i32";
        if (from == DType::i32 && to == DType::f32) return "cast_i32_to_f32";
        if (from == DType::u8 && to == DType::f32) return "cast_u8_to_f32";
        return nullptr;
    };
    if (out.dtype == DType::u8)
        throw TypeError("cast: converting to u8 on the GPU is not supported (u8 is a storage dtype for buffers)");
    if (const char* shader = one_step(x.dtype, out.dtype)) {
        CastPush p{x.address(), out.address(), u32(out.numel(), "cast")};
        const uint64_t threads = out.dtype == DType::f16 ? (out.numel() + 1) / 2 : out.numel();
        record(shader, p, groups(threads), {span(x)}, {span(out)});
        return;
    }
    TensorPtr wide = make_on(Device::gpu, x.ne, x.ndim, DType::f32);  // i32 / u8 <-> f16 goes through f32
    cast_into(x, *wide);
    cast_into(*wide, out);
}

// ---- columns ---------------------------------------------------------------------------

struct ColumnsPush {
    uint64_t a, b, o;
    uint32_t rows, cols;
};

void columns(const char* variant, const TensorImpl& a, const TensorImpl* b, TensorImpl& out) {
    ColumnsPush p{a.address(), b ? b->address() : 0, out.address(), u32(a.ne[0], variant),
                  u32(n_columns(a), variant)};
    std::vector<vk::Range> reads{span(a)};
    if (b) reads.push_back(span(*b));
    record(std::string("columns_") + variant, p, p.cols, reads, {span(out)});
}

// ---- indexing --------------------------------------------------------------------------

struct IndexPush {
    uint64_t x, index, o;
    uint32_t rows, limit, n_index, total;
};

void index_op(const char* variant, const TensorImpl* x, const TensorImpl& index, TensorImpl& out, int64_t rows,
              int64_t limit) {
    IndexPush p{x ? x->address() : 0, index.address(), out.address(), u32(rows, variant), u32(limit, variant),
                u32(index.numel(), variant), u32(out.numel(), variant)};
    std::vector<vk::Range> reads{span(index)};
    if (x) reads.push_back(span(*x));
    record(std::string("index_") + variant, p, groups(p.total), reads, {span(out)});
}

struct RowsPush {
    uint64_t x, o;
    uint32_t x_rows, out_rows, src0, dst0, n, zero_outside, total;
};

void rows_window(const TensorImpl& x, TensorImpl& out, int64_t src0, int64_t dst0, int64_t n, bool zero_outside) {
    RowsPush p{x.address(), out.address(), u32(x.ne[0], "rows"), u32(out.ne[0], "rows"), u32(src0, "rows"),
               u32(dst0, "rows"), u32(n, "rows"), zero_outside ? 1u : 0u, u32(out.numel(), "rows")};
    record("rows", p, groups(p.total), {span(x)}, {span(out)});
}

struct RandomPush {
    uint64_t logits, o;
    uint64_t stream;
    uint32_t n, rows;
    uint64_t stream_at;  // where to read the stream instead (a recorded program's slot), or 0
};

// A random op's stream: drawn now when the op runs; while a program records its command buffer,
// read at every replay from a slot the host fills with a fresh draw before each submission.
void random_op(const char* shader, RandomPush p, std::vector<vk::Range> reads, const TensorImpl& out) {
    p.stream_at = ctx().take_stream_slot();
    if (p.stream_at)
        reads.push_back({p.stream_at, p.stream_at + sizeof(uint64_t)});
    else
        p.stream = next_stream();
    record(shader, p, groups(p.n), reads, {span(out)});
}

}  // namespace

#define RK_VK_BINARY(name) \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) { binary(#name, in, attrs, out); }
RK_VK_BINARY(add)
RK_VK_BINARY(sub)
RK_VK_BINARY(mul)
RK_VK_BINARY(div)
RK_VK_BINARY(minimum)
RK_VK_BINARY(maximum)
RK_VK_BINARY(ge)
RK_VK_BINARY(gt)
RK_VK_BINARY(relu_back)
RK_VK_BINARY(sigmoid_back)
RK_VK_BINARY(tanh_back)
RK_VK_BINARY(silu_back)
RK_VK_BINARY(clamp_back)
#undef RK_VK_BINARY

#define RK_VK_UNARY(name) \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) { unary(#name, in, attrs, out); }
RK_VK_UNARY(neg)
RK_VK_UNARY(relu)
RK_VK_UNARY(sigmoid)
RK_VK_UNARY(tanh)
RK_VK_UNARY(softplus)
RK_VK_UNARY(silu)
RK_VK_UNARY(exp)
RK_VK_UNARY(log)
RK_VK_UNARY(sqrt)
RK_VK_UNARY(square)
RK_VK_UNARY(abs)
RK_VK_UNARY(sign)
RK_VK_UNARY(scale)
RK_VK_UNARY(pow)
RK_VK_UNARY(clamp)
#undef RK_VK_UNARY

void vk_cast(const Inputs& in, const OpAttrs&, TensorImpl& out) { cast_into(*in[0], out); }

struct MatmulPush {
    uint64_t a, b, c;
    uint32_t m, n, k, lda, ldb, ta, tb, ne2, sa2, sa3, sb2, sb3, groups_m;
};

void vk_matmul(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl &a = *in[0], &b = *in[1];
    const bool ta = attrs.ints[0] != 0, tb = attrs.ints[1] != 0;
    MatmulPush p{a.address(), b.address(), out.address()};
    p.m = u32(out.ne[0], "matmul");
    p.n = u32(out.ne[1], "matmul");
    p.k = u32(ta ? a.ne[0] : a.ne[1], "matmul");
    p.lda = u32(a.ne[0], "matmul");
    p.ldb = u32(b.ne[0], "matmul");
    p.ta = ta;
    p.tb = tb;
    p.ne2 = u32(out.ne[2], "matmul");
    const int64_t a_slice = a.ne[0] * a.ne[1], b_slice = b.ne[0] * b.ne[1];
    p.sa2 = a.ne[2] == 1 ? 0 : u32(a_slice, "matmul");
    p.sa3 = a.ne[3] == 1 ? 0 : u32(a_slice * a.ne[2], "matmul");
    p.sb2 = b.ne[2] == 1 ? 0 : u32(b_slice, "matmul");
    p.sb3 = b.ne[3] == 1 ? 0 : u32(b_slice * b.ne[2], "matmul");
    p.groups_m = uint32_t((p.m + 63) / 64);
    const uint64_t tiles = uint64_t(p.groups_m) * ((p.n + 63) / 64);
    record("matmul", p, tiles, {span(a), span(b)}, {span(out)}, u32(out.ne[2] * out.ne[3], "matmul"));
}

struct SumToPush {
    uint64_t x, o;
    uint32_t xne[4], one[4];
    uint32_t n_out, n_reduced;
};

void vk_sum_to(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    SumToPush p{x.address(), out.address()};
    shape4(x.ne, p.xne, "sum_to");
    shape4(out.ne, p.one, "sum_to");
    p.n_out = u32(out.numel(), "sum_to");
    p.n_reduced = u32(x.numel() / out.numel(), "sum_to");
    record("sum_to", p, p.n_out, {span(x)}, {span(out)});
}

struct ExpandPush {
    uint64_t x, o;
    uint32_t ne[4], sx[4];
    uint32_t n;
};

void vk_expand(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    ExpandPush p{x.address(), out.address()};
    shape4(out.ne, p.ne, "expand");
    const Shape sx = broadcast_strides(x, out.ne);
    for (int d = 0; d < kMaxDims; ++d) p.sx[d] = u32(sx[d], "expand");
    p.n = u32(out.numel(), "expand");
    record("expand", p, groups(p.n), {span(x)}, {span(out)});
}

void vk_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("softmax", *in[0], nullptr, out); }
void vk_log_softmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("log_softmax", *in[0], nullptr, out); }
void vk_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("softmax_back", *in[0], in[1].get(), out); }
void vk_log_softmax_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    columns("log_softmax_back", *in[0], in[1].get(), out);
}
void vk_max(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("max", *in[0], nullptr, out); }
void vk_argmax(const Inputs& in, const OpAttrs&, TensorImpl& out) { columns("argmax", *in[0], nullptr, out); }

void vk_softmax_cross_entropy(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    ColumnsPush p{in[0]->address(), in[1]->address(), out.address(), u32(in[0]->ne[0], "softmax_cross_entropy"),
                  u32(n_columns(*in[0]), "softmax_cross_entropy")};
    record("softmax_cross_entropy", p, 1, {span(*in[0]), span(*in[1])}, {span(out)});
}

struct TransposePush {
    uint64_t x, o;
    uint32_t rows, cols, n;
};

void vk_transpose(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    TransposePush p{x.address(), out.address(), u32(x.ne[0], "transpose"), u32(x.ne[1], "transpose"),
                    u32(x.numel(), "transpose")};
    record("transpose", p, groups(p.n), {span(x)}, {span(out)});
}

void vk_reshape(const Inputs& in, const OpAttrs&, TensorImpl& out) { ctx().copy(*in[0], out); }

void vk_slice_rows(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    rows_window(*in[0], out, attrs.ints[0], 0, out.ne[0], true);
}

void vk_pad_rows(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    rows_window(*in[0], out, 0, attrs.ints[0], in[0]->ne[0], true);
}

void vk_concat_rows(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    rows_window(*in[0], out, 0, 0, in[0]->ne[0], false);
    rows_window(*in[1], out, 0, in[0]->ne[0], in[1]->ne[0], false);
}

void vk_gather(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    index_op("gather", in[0].get(), *in[1], out, in[0]->ne[0], in[0]->ne[0]);
}

void vk_one_hot(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    index_op("one_hot", nullptr, *in[0], out, attrs.ints[0], attrs.ints[0]);
}

void vk_get_rows(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    // Columns move as 32-bit words: a u8 column of 4k bytes is k words.
    const int64_t words_per_column = x.dtype == DType::u8 ? x.ne[0] / 4 : x.ne[0];
    index_op("get_rows", &x, *in[1], out, words_per_column, x.ne[1]);
}

void vk_scatter_cols(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    index_op("scatter_cols", in[0].get(), *in[1], out, in[0]->ne[0], attrs.ints[0]);
}

struct PrefixPush {
    uint64_t a, b, o;
    uint32_t rows, n;
};

void vk_cumsum(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    PrefixPush p{x.address(), 0, out.address(), u32(x.ne[0], "cumsum"), u32(n_columns(x), "cumsum")};
    record("prefix_cumsum", p, p.n, {span(x)}, {span(out)});
}

void vk_searchsorted(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &sorted = *in[0], &query = *in[1];
    PrefixPush p{sorted.address(), query.address(), out.address(), u32(sorted.ne[0], "searchsorted"),
                 u32(query.numel(), "searchsorted")};
    record("prefix_searchsorted", p, groups(p.n), {span(sorted), span(query)}, {span(out)});
}

void vk_put_cols(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &x = *in[0], &index = *in[1], &values = *in[2];
    // the values play "x" and the target plays "o" in index.comp
    IndexPush p{values.address(), index.address(), x.address(), u32(x.ne[0], "put_cols"), u32(x.ne[1], "put_cols"),
                u32(index.numel(), "put_cols"), u32(x.ne[0], "put_cols")};
    record("index_put_cols", p, groups(p.total), {span(values), span(index), span(x)}, {span(x)});
    ctx().fill(out, 0u);
}

void vk_full(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    const double value = attrs.floats[0];
    uint32_t pattern;
    if (out.dtype == DType::i32) {
        const int32_t v = int32_t(value);
        std::memcpy(&pattern, &v, 4);
    } else if (out.dtype == DType::u8) {
        pattern = uint32_t(std::clamp(value, 0.0, 255.0)) * 0x01010101u;  // the byte in all four lanes
    } else {
        const float v = float(value);
        std::memcpy(&pattern, &v, 4);
    }
    ctx().fill(out, pattern);
}

void vk_rand(const Inputs&, const OpAttrs&, TensorImpl& out) {
    random_op("random_rand", RandomPush{0, out.address(), 0, u32(out.numel(), "rand"), 1}, {}, out);
}

void vk_randn(const Inputs&, const OpAttrs&, TensorImpl& out) {
    random_op("random_randn", RandomPush{0, out.address(), 0, u32(out.numel(), "randn"), 1}, {}, out);
}

void vk_sample_categorical(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& logits = *in[0];
    RandomPush p{logits.address(), out.address(), 0, u32(out.numel(), "sample_categorical"),
                 u32(logits.ne[0], "sample_categorical")};
    random_op("random_sample_categorical", p, {span(logits)}, out);
}

namespace vk {

struct OptimPush {
    uint64_t w, g, m, v;
    uint32_t n;
    float beta1, beta2, eps, coupled_wd, decay, step, inv_bc2;
    uint64_t hyper, scale;  // the captured steps' buffers
};

void adam(TensorImpl& w, const TensorImpl& g, TensorImpl& m, TensorImpl& v, const AdamCoefficients& c) {
    OptimPush p{w.address(), g.address(), m.address(), v.address(), u32(w.numel(), "adam")};
    p.beta1 = float(c.beta1);
    p.beta2 = float(c.beta2);
    p.eps = float(c.eps);
    p.coupled_wd = float(c.coupled_wd);
    p.decay = float(c.decay);
    p.step = float(c.step);
    p.inv_bc2 = float(c.inv_bc2);
    record("optim_adam", p, groups(p.n), {span(w), span(g), span(m), span(v)}, {span(w), span(m), span(v)});
}

void sgd(TensorImpl& w, const TensorImpl& g, TensorImpl& velocity, double lr, double momentum, double weight_decay) {
    OptimPush p{w.address(), g.address(), velocity.address(), velocity.address(), u32(w.numel(), "sgd")};
    p.beta1 = float(momentum);  // the SGD slots: momentum, weight decay, lr
    p.beta2 = float(weight_decay);
    p.eps = float(lr);
    record("optim_sgd", p, groups(p.n), {span(w), span(g), span(velocity)}, {span(w), span(velocity)});
}

}  // namespace vk

void vk_adam_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &w = *in[0], &g = *in[1], &m = *in[2], &v = *in[3], &hyper = *in[4], &scale = *in[5];
    vk::OptimPush p{w.address(), g.address(), m.address(), v.address(), u32(w.numel(), "adam_step")};
    p.hyper = hyper.address();
    p.scale = scale.address();
    record("optim_adam_step", p, groups(p.n), {span(w), span(g), span(m), span(v), span(hyper), span(scale)},
           {span(w), span(m), span(v)});
    ctx().copy(scale, out);
}

void vk_sgd_step(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl &w = *in[0], &g = *in[1], &vel = *in[2], &hyper = *in[3], &scale = *in[4];
    vk::OptimPush p{w.address(), g.address(), vel.address(), vel.address(), u32(w.numel(), "sgd_step")};
    p.hyper = hyper.address();
    p.scale = scale.address();
    record("optim_sgd_step", p, groups(p.n), {span(w), span(g), span(vel), span(hyper), span(scale)},
           {span(w), span(vel)});
    ctx().copy(scale, out);
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

}  // namespace rk
