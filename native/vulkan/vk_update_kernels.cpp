// The passes over a whole parameter set on the GPU, one dispatch each (two for the sum of
// squares): the optimizer updates, the target networks' polyak update and the sum of squares of a
// gradient norm.
#include <algorithm>

#include "backend.hpp"
#include "optim.hpp"
#include "vulkan/vk_context.hpp"
#include "vulkan/vk_kernels.hpp"
#include "vulkan/vk_record.hpp"

namespace rk {

using vk::ctx;
using vk::device_table;
using vk::kGroup;
using vk::record;
using vk::span;
using vk::u32;

// ---- optimizer updates ------------------------------------------------------------------
//
// One dispatch updates a whole parameter set: the host cuts each parameter's elements into
// chunks of kUpdateChunk and writes one record per chunk (the four tensors' addresses and the
// chunk's elements) into a table the dispatch reads by address; workgroup i updates chunk i.
// The table is written into the command buffer (Context::write), so a recorded program carries
// its own, made from the addresses it was recorded with (a moved tensor re-records it).

namespace {

constexpr int64_t kUpdateChunk = 4 * kGroup;  // elements per workgroup: 4 per invocation

// Calls add(begin, count) for each kUpdateChunk-element chunk of a tensor of n elements.
template <typename Add>
void for_each_chunk(int64_t n, const Add& add) {
    for (int64_t begin = 0; begin < n; begin += kUpdateChunk)
        add(uint32_t(begin), uint32_t(std::min(kUpdateChunk, n - begin)));
}

struct UpdateChunk {  // optim.comp's Chunk (std430: 40 bytes)
    uint64_t w, g, m, v;
    uint32_t begin, count;
};
static_assert(sizeof(UpdateChunk) == 40, "optim.comp reads records of 40 bytes");

struct OptimPush {
    uint64_t table;
    uint64_t hyper, scale;  // Adam and SGD: their coefficients' and the gradients' factor's buffers
    uint32_t n_chunks;
    float tau;  // Polyak
    uint32_t scale_is_sum_squares;  // Adam and SGD: the scale buffer holds the sum of squares ...
    float max_grad_norm;            // ... whose clipping factor multiplies the gradients
};

// Records the update of `set` by `shader`, which reads `reads` too (an update's hyper and scale).
void update_parameters(const char* shader, const UpdateSet& set, OptimPush push, std::vector<vk::Range> reads) {
    std::vector<UpdateChunk> chunks;
    std::vector<vk::Range> writes;
    for (const UpdateTensors& u : set) {
        for_each_chunk(u32(u.w->numel(), shader), [&](uint32_t begin, uint32_t count) {
            chunks.push_back({u.w->address(), u.g->address(), u.m->address(), u.v->address(), begin, count});
        });
        reads.insert(reads.end(), {span(*u.w), span(*u.g), span(*u.m), span(*u.v)});
        writes.insert(writes.end(), {span(*u.w), span(*u.m), span(*u.v)});
    }
    if (chunks.empty()) return;
    TensorPtr table = device_table(chunks);
    reads.push_back(span(*table));
    push.table = table->address();
    push.n_chunks = u32(int64_t(chunks.size()), shader);
    record(shader, push, chunks.size(), reads, writes);
}

// adam_step and sgd_step: the set's update by the coefficients of in[0] and the gradients' factor
// (in[1], or the clipping factor of the sum of squares in[1] holds), in[1] the output.
void update_step(const char* shader, const Inputs& in, const OpAttrs& attrs, bool adam, TensorImpl& out) {
    const TensorImpl &hyper = *in[0], &scale = *in[1];
    OptimPush push{0, hyper.address(), scale.address()};
    push.scale_is_sum_squares = scale_is_sum_squares(attrs);
    push.max_grad_norm = push.scale_is_sum_squares ? float(attrs.floats[0]) : 0.0f;
    update_parameters(shader, update_set(in, adam), push, {span(hyper), span(scale)});
    ctx().copy(scale, out);
}

}  // namespace

void vk_adam_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    update_step("optim_adam", in, attrs, true, out);
}

void vk_sgd_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    update_step("optim_sgd", in, attrs, false, out);
}

void vk_polyak_step(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    OptimPush p{};
    p.tau = float(attrs.floats[0]);
    update_parameters("optim_polyak", polyak_set(in), p, {});
    ctx().fill(out, 0);
}

// ---- the sum of squares of a tensor set (a gradient norm) --------------------------------------

namespace {

struct NormChunk {  // norm.comp's Chunk (std430: 16 bytes)
    uint64_t x;
    uint32_t begin, count;
};
static_assert(sizeof(NormChunk) == 16, "norm.comp reads records of 16 bytes");

struct NormPush {
    uint64_t table, partials, o, count;
    uint32_t n_chunks;
};

}  // namespace

void vk_sum_squares(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    std::vector<NormChunk> chunks;
    std::vector<vk::Range> reads;
    for (const TensorPtr& x : in) {
        for_each_chunk(u32(x->numel(), "sum_squares"),
                       [&](uint32_t begin, uint32_t count) { chunks.push_back({x->address(), begin, count}); });
        reads.push_back(span(*x));
    }
    TensorPtr table = device_table(chunks);
    TensorPtr partials = make_on(Device::gpu, {int64_t(chunks.size()), 1, 1, 1}, 2, DType::f32);  // [n_chunks, 1]
    // The workgroups done: written 0 once (a table), and back to 0 by the last one at every run.
    TensorPtr count = device_table(std::vector<uint32_t>{0});
    reads.push_back(span(*table));
    NormPush p{table->address(), partials->address(), out.address(), count->address(),
               u32(int64_t(chunks.size()), "sum_squares")};
    record("sum_squares", p, chunks.size(), reads, {span(*partials), span(out), span(*count)});
}

}  // namespace rk
