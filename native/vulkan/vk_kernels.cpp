// The Vulkan column of the op table: for each op, the shader variant it records and the push
// constants it passes (each struct mirrors the push_constant block of its shader, std430).
// matmul and linear (and which kernel multiplies where) are in vk_matmul_kernels.cpp, the passes
// over a whole parameter set (optimizer and target-network updates, the sum of squares) in
// vk_update_kernels.cpp, the sequence ops (state-space layers, recurrences) in
// vk_sequence_kernels.cpp, their chunked forms in vk_chunk_kernels.cpp.
#include <algorithm>
#include <cstring>

#include "backend.hpp"
#include "kernel_util.hpp"
#include "random.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_record.hpp"
#include "vulkan/vk_shaders.hpp"
#include "elementwise_chain.hpp"

namespace rk {

using vk::ctx;
using vk::device_table;
using vk::groups;
using vk::record;
using vk::shape4;
using vk::span;
using vk::u32;

namespace {

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
    float scale;
};

// out = x in out's dtype; from u8 or i32 to f32, times `scale` (cast's attribute).
void cast_into(const TensorImpl& x, TensorImpl& out, float scale = 1.0f) {
    if (x.dtype == out.dtype) {
        ctx().copy(x, out);
        return;
    }
    auto one_step = [](DType from, DType to) -> const char* {
        if (from == DType::f32 && to == DType::f16) return "cast_f32_to_f16";
        if (from == DType::f16 && to == DType::f32) return "cast_f16_to_f32";
        if (from == DType::f32 && to == DType::bf16) return "cast_f32_to_bf16";
        if (from == DType::bf16 && to == DType::f32) return "cast_bf16_to_f32";
        if (from == DType::f32 && to == DType::i32) return "cast_f32_to_i32";
        if (from == DType::i32 && to == DType::f32) return "cast_i32_to_f32";
        if (from == DType::u8 && to == DType::f32) return "cast_u8_to_f32";
        return nullptr;
    };
    if (out.dtype == DType::u8)
        throw TypeError("cast: converting to u8 on the GPU is not supported (u8 is a storage dtype for buffers)");
    if (const char* shader = one_step(x.dtype, out.dtype)) {
        CastPush p{x.address(), out.address(), u32(out.numel(), "cast"), scale};
        const uint64_t threads = is_half(out.dtype) ? (out.numel() + 1) / 2 : out.numel();  // a word each
        record(shader, p, groups(threads), {span(x)}, {span(out)});
        return;
    }
    TensorPtr wide = make_on(Device::gpu, x.ne, x.ndim, DType::f32);  // the others (f16 <-> bf16, i32 -> f16...) go through f32
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
    // The shader moves one 32-bit word per invocation: total counts the words of out, not its
    // elements (a u8 gather's out has 4 elements a word; counting elements wrote 4x past its end).
    IndexPush p{x ? x->address() : 0, index.address(), out.address(), u32(rows, variant), u32(limit, variant),
                u32(index.numel(), variant), u32(int64_t(out.nbytes() / 4), variant)};
    std::vector<vk::Range> reads{span(index)};
    if (x) reads.push_back(span(*x));
    record(std::string("index_") + variant, p, groups(p.total), reads, {span(out)});
}

struct RowsPush {
    uint64_t x, o;
    uint32_t x_rows, out_rows, src0, dst0, n, zero_outside, total;
};

void rows_window(const TensorImpl& x, TensorImpl& out, int64_t src0, int64_t dst0, int64_t n, bool zero_outside) {
    const int64_t columns = n_columns(out);
    RowsPush p{x.address(), out.address(), u32(x.ne[0], "rows"), u32(out.ne[0], "rows"), u32(src0, "rows"),
               u32(dst0, "rows"), u32(n, "rows"), zero_outside ? 1u : 0u,
               u32(zero_outside ? out.numel() : n * columns, "rows")};  // n * columns <= out.numel()
    // A window of one column is one run of bytes: the two halves of a concat write apart, so
    // the recorder runs them side by side.
    const uint64_t word = dtype_size(out.dtype);
    const vk::Range written = zero_outside || columns != 1
                                  ? span(out)
                                  : vk::Range{out.address() + uint64_t(dst0) * word, out.address() + uint64_t(dst0 + n) * word};
    record("rows", p, groups(p.total), {span(x)}, {written});
}

struct RandomPush {
    uint64_t x, o;  // x: sample_categorical's logits, randint's high
    uint64_t stream;
    uint32_t n, rows;
    uint64_t stream_at;  // where to read the stream instead (a recorded program's slot), or 0
    float below;         // rand's cap (largest_below_one of the dtype the result is rounded to)
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

// The elementwise ops (native/elementwise.def): each records its own variant of binary.comp
// (binary ops and backward helpers) or unary.comp, which shaders/variants.cmake makes from the
// same list (an entry it could not read fails here).
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value)                                                   \
    static_assert(vk::has_shader_variant(ElementwiseKind::kind == ElementwiseKind::unary ? "unary_" #name           \
                                                                                         : "binary_" #name),        \
                  "no shader variant of the elementwise op " #name " (shaders/variants.cmake reads "            \
                  "native/elementwise.def: is its entry on one line, at the start of it?)");                     \
    void vk_##name(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {                                      \
        if constexpr (ElementwiseKind::kind == ElementwiseKind::unary)                                             \
            unary(#name, in, attrs, out);                                                                          \
        else                                                                                                       \
            binary(#name, in, attrs, out);                                                                         \
    }
#include "elementwise.def"
#undef RK_ELEMENTWISE

void vk_cast(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    cast_into(*in[0], out, attrs.floats.empty() ? 1.0f : float(attrs.floats[0]));
}

// Master weights: each f32 master rounded into its f16 / bf16 parameter.
void vk_cast_into(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    for (size_t at = 0; at < in.size(); at += 2) cast_into(*in[at + 1], *in[at]);
    ctx().fill(out, 0);
}

namespace {

struct ChainStepRecord {  // chain.comp's Step (std430: 20 bytes)
    uint32_t op;
    int32_t a, b;
    float p0, p1;
};
static_assert(sizeof(ChainStepRecord) == 20, "chain.comp reads steps of 20 bytes");

struct ChainPush {
    uint64_t inputs[kMaxChainInputs];
    uint64_t o, steps;
    uint32_t n, n_steps, scalar_mask;
};

}  // namespace

// The steps go into a table the kernel reads (written into the command buffer, as the
// optimizers' tables are); each invocation runs the whole chain on one element.
void vk_elementwise_chain(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    std::vector<ChainStepRecord> records;
    for (const ChainStep& step : chain_steps(attrs))
        records.push_back({elementwise_op(step.op)->code, step.a, step.b, step.p0, step.p1});
    TensorPtr table = device_table(records);
    ChainPush p{};
    std::vector<vk::Range> reads{span(*table)};
    for (size_t k = 0; k < in.size(); ++k) {
        p.inputs[k] = in[k]->address();
        if (in[k]->numel() == 1 && out.numel() != 1) p.scalar_mask |= 1u << k;
        reads.push_back(span(*in[k]));
    }
    p.o = out.address();
    p.steps = table->address();
    p.n = u32(out.numel(), "elementwise_chain");
    p.n_steps = uint32_t(records.size());
    record("elementwise_chain", p, groups(p.n), reads, {span(out)});
}

struct SumToPush {
    uint64_t x, o;
    uint32_t xne[4], one[4];
    uint32_t n_out, n_reduced;
    uint32_t inner, split_len;
    uint32_t per_invocation;  // 1: an invocation per output (short sums), 0: a workgroup per output
};

// sum_to.comp's inner: where the dimensions x keeps form one block (those of size 1 aside), the
// number of reduced elements before it (all of them where nothing is kept); else 0.
uint32_t sum_inner(const TensorImpl& x, const TensorImpl& out) {
    int64_t inner = 1;
    bool kept_seen = false, kept_ended = false;
    for (int d = 0; d < 4; ++d) {
        if (x.ne[d] == 1) continue;
        const bool kept = out.ne[d] != 1;
        if (kept && kept_ended) return 0;  // a second block of kept dimensions
        if (!kept && kept_seen) kept_ended = true;
        if (!kept && !kept_seen) inner *= x.ne[d];
        kept_seen |= kept;
    }
    return uint32_t(inner);  // at most n_reduced, checked to fit 32 bits
}

// A sum with fewer outputs than kSumTargetGroups, each over more than kLongSum elements, has its
// reduction cut into z slices of at least kMinSumSlice (a whole loss summed by one workgroup took
// 0.6 ms for 409600 elements on the H200); shorter ones are left whole, where the level the split
// adds would cost more than it saves (conv2d's bias gradients in a DQN update: 1568 to 12800).
constexpr uint64_t kSumTargetGroups = 512, kLongSum = 16384, kMinSumSlice = 2048;
// Short sums take an invocation each, adding their elements in order: those of at most
// kTinySum elements, and those of at most kShortSum where there are at least kManySums outputs. A
// workgroup per output left 255 of its 256 invocations idle on a gradient as large as its input
// (a packed output's 17.8M elements summed one by one: 44 ms on the H200) or on a sum over each
// chunk's 16 tokens; an invocation walking 64 elements alone, one read after another, made a
// DQN update's bias gradients (256 sums over a batch of 64) slower (157 -> 196 us a update).
constexpr uint64_t kTinySum = 8, kShortSum = 64, kManySums = 4096;

void vk_sum_to(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    SumToPush p{x.address(), out.address()};
    shape4(x.ne, p.xne, "sum_to");
    shape4(out.ne, p.one, "sum_to");
    p.n_out = u32(out.numel(), "sum_to");
    p.n_reduced = u32(x.numel() / out.numel(), "sum_to");
    p.inner = sum_inner(x, out);
    const uint64_t wanted = std::max<uint64_t>(1, kSumTargetGroups / p.n_out);
    const uint64_t splits = p.n_reduced <= kLongSum ? 1 : std::min<uint64_t>({wanted, p.n_reduced / kMinSumSlice, 65535});
    p.split_len = uint32_t((p.n_reduced + splits - 1) / splits);
    if (p.n_reduced <= kTinySum || (p.n_reduced <= kShortSum && p.n_out >= kManySums)) {
        p.per_invocation = 1;
        record("sum_to", p, groups(p.n_out), {span(x)}, {span(out)});
        return;
    }
    if (splits <= 1) {
        record("sum_to", p, p.n_out, {span(x)}, {span(out)});
        return;
    }
    TensorPtr partials = vk::split_partials(out, int64_t(splits), "sum_to");
    p.o = partials->address();
    record("sum_to", p, p.n_out, {span(x)}, {span(*partials)}, uint32_t(splits));
    vk::record_sum_splits(*partials, uint32_t(splits), {nullptr, 0, 0, 0}, out, "sum_to");
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

struct PermutePush {
    uint64_t x, o;
    uint32_t ne0, ne1, ne2, s0, s1, s2, s3, n;
};

void vk_permute(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TensorImpl& x = *in[0];
    if (dtype_size(x.dtype) != 4)
        throw TypeError(std::string("permute: on the GPU x must be a 4-byte dtype (f32, i32; f16 and bf16 are widened), got ") +
                        dtype_name(x.dtype));
    const uint32_t n = u32(x.numel(), "permute");  // every index below is smaller
    const uint32_t x_stride[kMaxDims] = {1, uint32_t(x.ne[0]), uint32_t(x.ne[0] * x.ne[1]), uint32_t(x.ne[0] * x.ne[1] * x.ne[2])};
    uint32_t s[kMaxDims];
    for (int d = 0; d < kMaxDims; ++d) s[d] = x_stride[attrs.ints[d]];  // checked by shape_permute
    PermutePush p{x.address(), out.address(), uint32_t(out.ne[0]), uint32_t(out.ne[1]), uint32_t(out.ne[2]),
                  s[0], s[1], s[2], s[3], n};
    record("permute", p, groups(p.n), {span(x)}, {span(out)});
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

void vk_rand(const Inputs&, const OpAttrs& attrs, TensorImpl& out) {
    // out is f32 here; an f16 or bf16 result is rounded from it afterwards (op_table.cpp)
    const float below = largest_below_one(DType(attrs.ints[kMaxDims + 1]));
    random_op("random_rand", RandomPush{0, out.address(), 0, u32(out.numel(), "rand"), 1, 0, below}, {}, out);
}

void vk_randn(const Inputs&, const OpAttrs&, TensorImpl& out) {
    random_op("random_randn", RandomPush{0, out.address(), 0, u32(out.numel(), "randn"), 1}, {}, out);
}

void vk_randint(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& high = *in[0];
    random_op("random_randint", RandomPush{high.address(), out.address(), 0, u32(out.numel(), "randint"), 1},
              {span(high)}, out);
}

void vk_sample_categorical(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const TensorImpl& logits = *in[0];
    RandomPush p{logits.address(), out.address(), 0, u32(out.numel(), "sample_categorical"),
                 u32(logits.ne[0], "sample_categorical")};
    random_op("random_sample_categorical", p, {span(logits)}, out);
}

}  // namespace rk
