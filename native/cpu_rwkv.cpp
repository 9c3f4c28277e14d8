// Linear-attention recurrences with a matrix state per head, as ggml defines them
// (ggml_rwkv_wkv6, ggml_gated_linear_attn), and their backward helpers. Sizes and packed layouts:
// recurrence.hpp. For one (sequence, head), with S_{t-1} the state before token t:
//   rwkv_wkv6:          y_t[j] = sum_i r_t[i] (u[i] k_t[i] v_t[j] + S_{t-1}[i,j])
//                       S_t[i,j] = td_t[i] S_{t-1}[i,j] + k_t[i] v_t[j]
//   gated_linear_attn:  S_t[i,j] = g_t[i] S_{t-1}[i,j] + k_t[i] v_t[j]
//                       y_t[j] = scale sum_i q_t[i] S_t[i,j]
// Every (sequence, head) is an independent task; the backward helpers recompute the states from
// the ones stored every kRecurrenceChunk tokens (never dividing by the decay to step back).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernel_util.hpp"
#include "recurrence.hpp"

namespace rk {

namespace {

// The inputs of a forward op: the per-token vectors (k, v, r-or-q, td-or-g), the bonus u
// (rwkv_wkv6 only) and the state.
struct Operands {
    const TensorImpl *k, *v, *r, *w, *u, *state;
};

// The sizes of a forward op, validated: recurrence_dims, and rwkv_wkv6's bonus [S, H].
RecurrenceDims checked_dims(const char* op, const Operands& o, const char* const* names) {
    const RecurrenceDims d =
        recurrence_dims(op, {{o.k, names[0]}, {o.v, names[1]}, {o.r, names[2]}, {o.w, names[3]}}, *o.state);
    if (o.u) {
        require_like(op, *o.u, *o.k, "tf", names[0]);
        if (o.u->ne[0] != d.S || o.u->ne[1] != d.H || o.u->ne[2] != 1 || o.u->ne[3] != 1)
            throw std::invalid_argument(op_err(op, "tf must be [S, H] = " + sizes({d.S, d.H}) + " (one bonus per key channel "
                                                   "and head), got " + o.u->shape_str()));
    }
    return d;
}

// Checks that a backward helper's upstream gradient is shaped like the forward output.
void require_packed_grad(const char* op, const TensorImpl& g, const RecurrenceDims& d) {
    if (g.ne[0] != d.token() || g.ne[1] != d.T + d.S * d.n_seqs || g.ne[2] != 1 || g.ne[3] != 1)
        throw std::invalid_argument(op_err(op, "the upstream gradient must be shaped like the forward output " +
                                                   sizes({d.token(), d.T + d.S * d.n_seqs}) + ", got " + g.shape_str()));
}

constexpr const char* kWkv6Names[] = {"k", "v", "r", "td"};
constexpr const char* kGlaNames[] = {"k", "v", "q", "g"};

Operands wkv6_operands(const Inputs& in, size_t first) {  // (k, v, r, tf, td, state)
    return {in[first].get(), in[first + 1].get(), in[first + 2].get(), in[first + 4].get(), in[first + 3].get(),
            in[first + 5].get()};
}

Operands gla_operands(const Inputs& in, size_t first) {  // (k, v, q, g, state)
    return {in[first].get(), in[first + 1].get(), in[first + 2].get(), in[first + 3].get(), nullptr, in[first + 4].get()};
}

RecurrenceDims dims_of(const char* op, const Operands& o) { return checked_dims(op, o, o.u ? kWkv6Names : kGlaNames); }

// Per-(sequence, head) addressing of the token vectors, states and outputs.
struct Task {
    const RecurrenceDims& d;
    int64_t b, h;
    int64_t token(int64_t tl) const { return ((b * d.seq_len() + tl) * d.H + h) * d.S; }  // a vector's start
    int64_t matrix() const { return (b * d.H + h) * d.matrix(); }                        // in a state column
};

// (sequence, head) tasks per parallel chunk: enough state updates to be worth a thread.
int64_t task_grain(const RecurrenceDims& d) {
    return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, d.seq_len() * d.matrix()));
}

void for_each_task(const RecurrenceDims& d, const std::function<void(int64_t b, int64_t h)>& fn) {
    parallel_for(d.n_seqs * d.H, task_grain(d), [&](int64_t lo, int64_t hi) {
        for (int64_t task = lo; task < hi; ++task) fn(task / d.H, task % d.H);
    });
}

// S <- w (.) S + k v^T, one row per key channel i.
template <typename T>
void advance(T* st, const T* k, const T* v, const T* w, int64_t S) {
    for (int64_t i = 0; i < S; ++i) {
        T* row = st + i * S;
        for (int64_t j = 0; j < S; ++j) row[j] = w[i] * row[j] + k[i] * v[j];
    }
}

template <typename T>
void forward(const Operands& o, const RecurrenceDims& d, bool bonus_form, T scale, TensorImpl& out) {
    const T *pk = o.k->ptr<T>(), *pv = o.v->ptr<T>(), *pr = o.r->ptr<T>(), *pw = o.w->ptr<T>();
    const T* pu = o.u ? o.u->ptr<T>() : nullptr;
    const T* ps = o.state->ptr<T>();
    T* po = out.ptr<T>();
    const int64_t S = d.S;
    for_each_task(d, [&](int64_t b, int64_t h) {
        const Task task{d, b, h};
        T* st = po + d.T * d.token() + task.matrix();  // the new-state region holds the running state
        std::memcpy(st, ps + task.matrix(), sizeof(T) * d.matrix());
        for (int64_t tl = 0; tl < d.seq_len(); ++tl) {
            const int64_t at = task.token(tl);
            const T *k = pk + at, *v = pv + at, *r = pr + at, *w = pw + at;
            T* y = po + at;
            std::fill(y, y + S, T(0));
            if (bonus_form) {  // rwkv_wkv6 reads the state before the update
                for (int64_t i = 0; i < S; ++i) {
                    const T* row = st + i * S;
                    const T bonus = r[i] * pu[h * S + i] * k[i];
                    for (int64_t j = 0; j < S; ++j) y[j] += r[i] * row[j] + bonus * v[j];
                }
                advance(st, k, v, w, S);
            } else {  // gated_linear_attn reads the updated state
                advance(st, k, v, w, S);
                for (int64_t i = 0; i < S; ++i)
                    for (int64_t j = 0; j < S; ++j) y[j] += r[i] * st[i * S + j];
                for (int64_t j = 0; j < S; ++j) y[j] *= scale;
            }
        }
    });
}

// The backward pass of one (sequence, head). g is the packed upstream gradient; D, the gradient
// of the state after the token being walked, lives in the initial state's gradient region.
// scratch: slabs() matrices of the worker's own, reused by its tasks (the output's scratch region
// is the GPU kernels'; pages of it written here would be faulted in fresh at every call).
template <typename T>
void backward_task(const Operands& o, const RecurrenceDims& d, bool bonus_form, T scale, const T* pg, T* po,
                   const BackLayout& l, T* scratch, int64_t b, int64_t h) {
    const T *pk = o.k->ptr<T>(), *pv = o.v->ptr<T>(), *pr = o.r->ptr<T>(), *pw = o.w->ptr<T>();
    const T* pu = o.u ? o.u->ptr<T>() : nullptr;
    const int64_t S = d.S, C = kRecurrenceChunk, plane = d.token() * d.T;
    const Task task{d, b, h};
    T* work = scratch;
    T* checkpoint = scratch + d.matrix();                   // n_chunks states
    T* slot = checkpoint + d.n_chunks() * d.matrix();       // C states of one chunk
    T* D = po + l.state + task.matrix();
    T* gu = bonus_form ? po + l.bonus + (b * d.H + h) * S : nullptr;

    std::memcpy(work, o.state->ptr<T>() + task.matrix(), sizeof(T) * d.matrix());
    for (int64_t tl = 0; tl < d.seq_len(); ++tl) {
        if (tl % C == 0) std::memcpy(checkpoint + tl / C * d.matrix(), work, sizeof(T) * d.matrix());
        const int64_t at = task.token(tl);
        advance(work, pk + at, pv + at, pw + at, S);
    }
    std::memcpy(D, pg + plane + task.matrix(), sizeof(T) * d.matrix());  // dL/d(final state)
    if (gu) std::fill(gu, gu + S, T(0));

    for (int64_t c = d.n_chunks() - 1; c >= 0; --c) {
        const int64_t t0 = c * C, t1 = std::min(d.seq_len(), t0 + C);
        std::memcpy(work, checkpoint + c * d.matrix(), sizeof(T) * d.matrix());
        for (int64_t tl = t0; tl < t1; ++tl) {  // slot[s] = the state before token t0 + s
            std::memcpy(slot + (tl - t0) * d.matrix(), work, sizeof(T) * d.matrix());
            const int64_t at = task.token(tl);
            advance(work, pk + at, pv + at, pw + at, S);
        }
        for (int64_t tl = t1 - 1; tl >= t0; --tl) {
            const int64_t at = task.token(tl);
            const T *k = pk + at, *v = pv + at, *r = pr + at, *w = pw + at, *gy = pg + at;
            const T* prev = slot + (tl - t0) * d.matrix();
            T *gk = po + l.grads + at, *gv = gk + plane, *gr = gv + plane, *gw = gr + plane;
            // the sums over j are dot()s, out of the loops over j, which then vectorise
            if (bonus_form) {
                const T vg = dot(v, gy, S);
                T kur = 0;
                for (int64_t i = 0; i < S; ++i) kur += k[i] * pu[h * S + i] * r[i];
                for (int64_t j = 0; j < S; ++j) gv[j] = gy[j] * kur;
                for (int64_t i = 0; i < S; ++i) {
                    const T* Di = D + i * S;
                    const T* Pi = prev + i * S;
                    const T u = pu[h * S + i];
                    for (int64_t j = 0; j < S; ++j) gv[j] += k[i] * Di[j];
                    gk[i] = u * r[i] * vg + dot(v, Di, S);
                    gr[i] = u * k[i] * vg + dot(gy, Pi, S);
                    gw[i] = dot(Di, Pi, S);
                    gu[i] += r[i] * k[i] * vg;
                }
                for (int64_t i = 0; i < S; ++i)  // D_{t-1} = td_t (.) D_t + r_t gy_t^T
                    for (int64_t j = 0; j < S; ++j) D[i * S + j] = w[i] * D[i * S + j] + r[i] * gy[j];
            } else {
                for (int64_t j = 0; j < S; ++j) gv[j] = 0;
                const T gv_dot = dot(gy, v, S);
                for (int64_t i = 0; i < S; ++i) {
                    T* Di = D + i * S;
                    const T* Pi = prev + i * S;
                    const T read = scale * r[i];
                    for (int64_t j = 0; j < S; ++j) {
                        Di[j] += read * gy[j];  // D_t: the carry plus this token's read
                        gv[j] += k[i] * Di[j];
                    }
                    gk[i] = dot(v, Di, S);
                    gr[i] = scale * (w[i] * dot(gy, Pi, S) + k[i] * gv_dot);  // gy . S_t[i, :]
                    gw[i] = dot(Di, Pi, S);
                    for (int64_t j = 0; j < S; ++j) Di[j] *= w[i];  // the carry to token t - 1
                }
            }
        }
    }
}

template <typename T>
void backward(const Operands& o, const RecurrenceDims& d, bool bonus_form, T scale, const TensorImpl& g, TensorImpl& out) {
    const BackLayout l = back_layout(d, bonus_form);
    const T* pg = g.ptr<T>();
    T* po = out.ptr<T>();
    parallel_for(d.n_seqs * d.H, task_grain(d), [&](int64_t lo, int64_t hi) {
        std::vector<T> scratch(d.slabs() * d.matrix());
        for (int64_t task = lo; task < hi; ++task)
            backward_task<T>(o, d, bonus_form, scale, pg, po, l, scratch.data(), task / d.H, task % d.H);
    });
}

OutSpec forward_spec(const RecurrenceDims& d, DType dtype) {
    return OutSpec{{d.token(), d.T + d.S * d.n_seqs, 1, 1}, 2, dtype};
}

OutSpec back_spec(const RecurrenceDims& d, bool bonus_form, DType dtype) {
    return OutSpec{{d.token(), back_layout(d, bonus_form).total / d.token(), 1, 1}, 2, dtype};
}

double scale_attr(const char* op, const OpAttrs& attrs) {
    if (attrs.floats.size() != 1) throw std::invalid_argument(op_err(op, "expected one float attribute: scale"));
    return attrs.floats[0];
}

}  // namespace

RecurrenceDims recurrence_dims(const char* op, const std::vector<NamedInput>& vectors, const TensorImpl& state) {
    const TensorImpl& first = *vectors[0].tensor;
    const char* first_name = vectors[0].name;
    for (const NamedInput& v : vectors) require_float(op, *v.tensor, v.name);
    if (first.ne[3] != 1)
        throw std::invalid_argument(op_err(op, std::string(first_name) + " must be [S, H, T] (3 dimensions), got " +
                                                   first.shape_str()));
    const RecurrenceDims d{first.ne[0], first.ne[1], first.ne[2], state.ne[1]};
    for (const NamedInput& v : vectors) {
        require_like(op, *v.tensor, first, v.name, first_name);
        if (v.tensor->ne != first.ne)
            throw std::invalid_argument(op_err(op, std::string(v.name) + " must be [S, H, T] like " + first_name + " " +
                                                       first.shape_str() + ", got " + v.tensor->shape_str()));
    }
    require_like(op, state, first, "state", first_name);
    const int64_t state_rows = size_mul(d.S, d.S, d.H);
    if (state.ne[0] != state_rows || state.ne[2] != 1 || state.ne[3] != 1)
        throw std::invalid_argument(op_err(op, "state must be [S*S*H, n_seqs] with S*S*H = " + std::to_string(state_rows) +
                                                   " (one S x S matrix per head and sequence), got " + state.shape_str()));
    if (d.T % d.n_seqs != 0)
        throw std::invalid_argument(op_err(op, "T = " + std::to_string(d.T) + " tokens do not split into n_seqs = " +
                                               std::to_string(d.n_seqs) + " sequences of equal length (state " +
                                               state.shape_str() + " has one column per sequence)"));
    return d;
}

OutSpec shape_rwkv_wkv6(const Inputs& in, const OpAttrs&) {
    return forward_spec(dims_of("rwkv_wkv6", wkv6_operands(in, 0)), in[0]->dtype);
}

void cpu_rwkv_wkv6(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const Operands o = wkv6_operands(in, 0);
    const RecurrenceDims d = dims_of("rwkv_wkv6", o);
    dispatch_float(out.dtype, [&](auto tag) { forward<decltype(tag)>(o, d, true, 1, out); });
}

OutSpec shape_rwkv_wkv6_back(const Inputs& in, const OpAttrs&) {
    const RecurrenceDims d = dims_of("rwkv_wkv6_back", wkv6_operands(in, 1));
    require_like("rwkv_wkv6_back", *in[0], *in[1], "g", "k");
    require_packed_grad("rwkv_wkv6_back", *in[0], d);
    return back_spec(d, true, in[0]->dtype);
}

void cpu_rwkv_wkv6_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const Operands o = wkv6_operands(in, 1);
    const RecurrenceDims d = dims_of("rwkv_wkv6_back", o);
    dispatch_float(out.dtype, [&](auto tag) { backward<decltype(tag)>(o, d, true, 1, *in[0], out); });
}

OutSpec shape_gated_linear_attn(const Inputs& in, const OpAttrs& attrs) {
    scale_attr("gated_linear_attn", attrs);
    return forward_spec(dims_of("gated_linear_attn", gla_operands(in, 0)), in[0]->dtype);
}

void cpu_gated_linear_attn(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const Operands o = gla_operands(in, 0);
    const RecurrenceDims d = dims_of("gated_linear_attn", o);
    const double scale = scale_attr("gated_linear_attn", attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        forward<T>(o, d, false, T(scale), out);
    });
}

OutSpec shape_gated_linear_attn_back(const Inputs& in, const OpAttrs& attrs) {
    scale_attr("gated_linear_attn_back", attrs);
    const RecurrenceDims d = dims_of("gated_linear_attn_back", gla_operands(in, 1));
    require_like("gated_linear_attn_back", *in[0], *in[1], "g", "k");
    require_packed_grad("gated_linear_attn_back", *in[0], d);
    return back_spec(d, false, in[0]->dtype);
}

void cpu_gated_linear_attn_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const Operands o = gla_operands(in, 1);
    const RecurrenceDims d = dims_of("gated_linear_attn_back", o);
    const double scale = scale_attr("gated_linear_attn_back", attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        backward<T>(o, d, false, T(scale), *in[0], out);
    });
}

}  // namespace rk
