// Mamba's selective scan (ggml_ssm_scan) and its backward helper on the CPU. Sizes and the packed
// layouts: ssm_scan.hpp. Per sequence q, token t, head h, row p, state n:
//   dts = softplus(dt[h, t, q]),  dA[n] = exp(dts * A[n or 0, h])
//   S[n, p] = S[n, p] * dA[n] + B[n, g, t, q] * x[p, h, t, q] * dts
//   y[p, h, t, q] = sum_n S[n, p] * C[n, g, t, q]
// One task per (sequence, head): tasks share no output element.
#include "ssm_scan.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_util.hpp"

namespace rk {
namespace {

void require_shape(const char* op, const TensorImpl& t, const char* arg, const Shape& expected, const char* layout) {
    if (t.ne != expected)
        throw std::invalid_argument(op_err(op, std::string(arg) + " must be " + layout + " = " +
                                                   std::to_string(expected[0]) + "x" + std::to_string(expected[1]) + "x" +
                                                   std::to_string(expected[2]) + "x" + std::to_string(expected[3]) +
                                                   ", got " + t.shape_str()));
}

template <typename T>
T softplus_of(T v) { return v > T(20) ? v : std::log1p(std::exp(v)); }

template <typename T>
T softplus_slope(T v) { return v > T(20) ? T(1) : T(1) / (T(1) + std::exp(-v)); }

// Read-only views of one scan's inputs, with the index arithmetic of ggml's layouts.
template <typename T>
struct ScanInputs {
    const ScanDims& d;
    const T *s, *x, *dt, *a, *b, *c;
    const int32_t* ids;

    const T* x_at(int64_t q, int64_t t, int64_t h) const { return x + ((q * d.n_tok + t) * d.n_head + h) * d.head_dim; }
    T dt_at(int64_t q, int64_t t, int64_t h) const { return dt[(q * d.n_tok + t) * d.n_head + h]; }
    int64_t group_of(int64_t h) const { return h / (d.n_head / d.n_group); }
    const T* b_at(int64_t q, int64_t t, int64_t h) const { return b + ((q * d.n_tok + t) * d.n_group + group_of(h)) * d.d_state; }
    const T* c_at(int64_t q, int64_t t, int64_t h) const { return c + ((q * d.n_tok + t) * d.n_group + group_of(h)) * d.d_state; }
    const T* initial_state(int64_t q, int64_t h) const { return s + (int64_t(ids[q]) * d.n_head + h) * d.state_size(); }

    // dA[n] for one token, and softplus(dt) returned (Mamba-2's one decay per head: one exp).
    T decay(int64_t q, int64_t t, int64_t h, T* da) const {
        const T dts = softplus_of(dt_at(q, t, h));
        if (d.a_rows == 1)
            std::fill(da, da + d.d_state, std::exp(dts * a[h]));
        else
            for (int64_t n = 0; n < d.d_state; ++n) da[n] = std::exp(dts * a[h * d.a_rows + n]);
        return dts;
    }

    // One step of the recurrence from state `from` to state `to` ([d_state, head_dim]; they may
    // be one array); writes y[p] when y is given.
    void step(int64_t q, int64_t t, int64_t h, const T* from, T* to, T* da, T* y) const {
        const T dts = decay(q, t, h, da);
        const T *xt = x_at(q, t, h), *bt = b_at(q, t, h), *ct = c_at(q, t, h);
        for (int64_t p = 0; p < d.head_dim; ++p) {
            const T* row = from + p * d.d_state;
            T* next = to + p * d.d_state;
            const T xdt = xt[p] * dts;
            if (row == next)  // in place: one pointer, or the compiler's overlap check would refuse its vector loop
                for (int64_t n = 0; n < d.d_state; ++n) next[n] = next[n] * da[n] + bt[n] * xdt;
            else
                for (int64_t n = 0; n < d.d_state; ++n) next[n] = row[n] * da[n] + bt[n] * xdt;
            if (y) y[p] = dot(next, ct, d.d_state);
        }
    }
};

template <typename T>
ScanInputs<T> scan_inputs(const ScanDims& d, const Inputs& in, size_t first) {
    return {d, in[first]->ptr<T>(), in[first + 1]->ptr<T>(), in[first + 2]->ptr<T>(), in[first + 3]->ptr<T>(),
            in[first + 4]->ptr<T>(), in[first + 5]->ptr<T>(), in[first + 6]->ptr<int32_t>()};
}

void check_ids(const char* op, const TensorImpl& ids, const ScanDims& d) {
    const int32_t* p = ids.ptr<int32_t>();
    for (int64_t q = 0; q < d.n_seqs; ++q)
        if (p[q] < 0 || p[q] >= d.n_rs)
            throw std::out_of_range(op_err(op, "ids[" + std::to_string(q) + "] = " + std::to_string(p[q]) +
                                                   " is out of range for the " + std::to_string(d.n_rs) +
                                                   " states of s (expected 0 <= id < s.shape[3])"));
}

int64_t task_grain(const ScanDims& d) {
    return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, d.n_tok * d.state_size()));
}

// The states the CPU's walk back keeps for one task: the state at each chunk start, and the states
// of one chunk. A worker reuses its own for every task it runs (the output's scratch region,
// which the GPU's kernels use, stays untouched: pages of it the CPU wrote would be faulted in
// fresh at every call).
int64_t cpu_scratch_size(const ScanDims& d) { return (d.n_chunks() + d.chunk()) * d.state_size(); }

// One row p of a token's walk back: dL/dS_t[p, :] from dL/dS_{t+1} (times the carried decay)
// and what y_t[p] reads, and the row's shares of gB, gC and u. No sum over n, and __restrict
// arrays (one output holds several of them): the loop vectorises.
template <typename T>
void row_back(int64_t N, const T* __restrict carry, const T* __restrict ct, const T* __restrict after,
              const T* __restrict before, T gyp, T xtp, T* __restrict gr, T* __restrict gb, T* __restrict gc,
              T* __restrict u) {
    for (int64_t n = 0; n < N; ++n) {
        gr[n] = gr[n] * carry[n] + ct[n] * gyp;
        gb[n] += gr[n] * xtp;
        gc[n] += gyp * after[n];
        u[n] += gr[n] * before[n];
    }
}

// The gradients of one (sequence q, head h) task, walking the chunks backwards.
template <typename T>
void scan_backward_task(const ScanInputs<T>& in, const T* g, T* out, T* scratch, int64_t q, int64_t h) {
    const ScanDims& d = in.d;
    const int64_t E = d.state_size(), Q = d.chunk(), task = q * d.n_head + h;
    // the output's regions, once per task: their offsets are computed with overflow checks
    T *out_gx = out + d.gx_at(), *out_gdt = out + d.gdt_at(), *out_ga = out + d.ga_at(), *out_gb = out + d.gb_at(),
      *out_gc = out + d.gc_at();
    T* checkpoints = scratch;                     // [n_chunks][E]
    T* states = checkpoints + d.n_chunks() * E;  // [Q][E], one chunk
    // da: this token's decays; carry: the decays of the token after it, which dL/dS still owes
    // (applied in the next token's pass over it rather than in a pass of their own)
    std::vector<T> da(d.d_state), carry(d.d_state, T(1)), grad(E), gb(d.d_state), gc(d.d_state), u(d.d_state);

    // the state at each chunk start
    std::copy(in.initial_state(q, h), in.initial_state(q, h) + E, checkpoints);
    for (int64_t c = 1; c < d.n_chunks(); ++c) {
        in.step(q, (c - 1) * Q, h, checkpoints + (c - 1) * E, checkpoints + c * E, da.data(), nullptr);
        for (int64_t t = (c - 1) * Q + 1; t < c * Q; ++t)
            in.step(q, t, h, checkpoints + c * E, checkpoints + c * E, da.data(), nullptr);
    }

    // grad = dL/dS_t (times carry), starting from the final state's gradient
    const T* g_final = g + d.y_size() + task * E;
    std::copy(g_final, g_final + E, grad.begin());
    for (int64_t c = d.n_chunks(); c-- > 0;) {
        const int64_t t0 = c * Q, len = std::min(Q, d.n_tok - t0);
        for (int64_t k = 0; k < len; ++k)  // the states after each token of the chunk
            in.step(q, t0 + k, h, k ? states + (k - 1) * E : checkpoints + c * E, states + k * E, da.data(), nullptr);
        for (int64_t k = len; k-- > 0;) {
            const int64_t t = t0 + k;
            const T* before = k ? states + (k - 1) * E : checkpoints + c * E;
            const T* after = states + k * E;
            const T dts = in.decay(q, t, h, da.data());
            const T *xt = in.x_at(q, t, h), *bt = in.b_at(q, t, h), *ct = in.c_at(q, t, h);
            const T* gy = g + ((q * d.n_tok + t) * d.n_head + h) * d.head_dim;
            std::fill(gb.begin(), gb.end(), T(0));
            std::fill(gc.begin(), gc.end(), T(0));
            std::fill(u.begin(), u.end(), T(0));
            T* gx = out_gx + ((q * d.n_tok + t) * d.n_head + h) * d.head_dim;
            for (int64_t p = 0; p < d.head_dim; ++p) {
                T* gr = grad.data() + p * d.d_state;
                row_back(d.d_state, carry.data(), ct, after + p * d.d_state, before + p * d.d_state, gy[p], xt[p], gr,
                         gb.data(), gc.data(), u.data());
                gx[p] = dot(gr, bt, d.d_state) * dts;
            }
            const int64_t at = ((q * d.n_tok + t) * d.n_head + h) * d.d_state;  // [d_state, n_head, n_tok, n_seqs]
            T gdts = 0;
            for (int64_t n = 0; n < d.d_state; ++n) {
                const T an = in.a[h * d.a_rows + (d.a_rows == 1 ? 0 : n)];
                out_ga[at + n] = dts * da[n] * u[n];
                out_gb[at + n] = dts * gb[n];
                out_gc[at + n] = gc[n];
                gdts += an * da[n] * u[n] + bt[n] * gb[n];
            }
            out_gdt[(q * d.n_tok + t) * d.n_head + h] = gdts * softplus_slope(in.dt_at(q, t, h));
            carry.swap(da);  // dL/dS_{t-1} = dL/dS_t * dA_t + (what y_{t-1} adds)
        }
    }
    T* gs0 = out + d.gs0_at() + task * E;
    for (int64_t p = 0; p < d.head_dim; ++p)
        for (int64_t n = 0; n < d.d_state; ++n) gs0[p * d.d_state + n] = grad[p * d.d_state + n] * carry[n];
}

}  // namespace

ScanDims scan_dims(const char* op, const Inputs& in, size_t first) {
    const TensorImpl &s = *in[first], &x = *in[first + 1], &dt = *in[first + 2], &a = *in[first + 3],
                     &b = *in[first + 4], &c = *in[first + 5], &ids = *in[first + 6];
    const char* names[] = {"s", "x", "dt", "A", "B", "C"};
    for (size_t i = 0; i < 6; ++i) {
        require_float(op, *in[first + i], names[i]);
        if (in[first + i]->dtype != x.dtype)
            throw TypeError(op_err(op, std::string(names[i]) + " is " + dtype_name(in[first + i]->dtype) + " but x is " +
                                           dtype_name(x.dtype) + " (expected one float dtype)"));
    }
    require_index(op, ids, "ids");
    ScanDims d{b.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3], b.ne[1], s.ne[3], a.ne[0]};
    require_shape(op, b, "B", {d.d_state, d.n_group, d.n_tok, d.n_seqs}, "[d_state, n_group, n_tok, n_seqs]");
    require_shape(op, c, "C", b.ne, "like B [d_state, n_group, n_tok, n_seqs]");
    if (d.n_head % d.n_group != 0)
        throw std::invalid_argument(op_err(op, "n_head = " + std::to_string(d.n_head) + " (x's dim 1) is not a multiple of n_group = " +
                                                   std::to_string(d.n_group) + " (B's dim 1)"));
    require_shape(op, s, "s", {d.d_state, d.head_dim, d.n_head, d.n_rs}, "[d_state, head_dim, n_head, n_rs]");
    require_shape(op, dt, "dt", {d.n_head, d.n_tok, d.n_seqs, 1}, "[n_head, n_tok, n_seqs]");
    if (a.ne[1] != d.n_head || a.ne[2] != 1 || a.ne[3] != 1 || (a.ne[0] != 1 && a.ne[0] != d.d_state))
        throw std::invalid_argument(op_err(op, "A must be [1, n_head] (Mamba-2) or [d_state, n_head] (Mamba-1) = [1 or " +
                                                   std::to_string(d.d_state) + ", " + std::to_string(d.n_head) + "], got " +
                                                   a.shape_str()));
    if (ids.numel() != d.n_seqs)
        throw std::invalid_argument(op_err(op, "ids has " + std::to_string(ids.numel()) + " elements, expected one per sequence (" +
                                                   std::to_string(d.n_seqs) + ")"));
    return d;
}

OutSpec shape_ssm_scan(const Inputs& in, const OpAttrs&) {
    const ScanDims d = scan_dims("ssm_scan", in, 0);
    return OutSpec{{d.y_size() + d.final_size(), 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_ssm_scan(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ScanDims d = scan_dims("ssm_scan", in, 0);
    check_ids("ssm_scan", *in[6], d);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const ScanInputs<T> si = scan_inputs<T>(d, in, 0);
        T* po = out.ptr<T>();
        parallel_for(d.tasks(), task_grain(d), [&](int64_t lo, int64_t hi) {
            std::vector<T> da(d.d_state);
            for (int64_t task = lo; task < hi; ++task) {
                const int64_t q = task / d.n_head, h = task % d.n_head;
                T* state = po + d.y_size() + task * d.state_size();  // scanned in place: the final state
                for (int64_t t = 0; t < d.n_tok; ++t)
                    si.step(q, t, h, t ? state : si.initial_state(q, h), state, da.data(),
                            po + ((q * d.n_tok + t) * d.n_head + h) * d.head_dim);
            }
        });
    });
}

OutSpec shape_ssm_scan_back(const Inputs& in, const OpAttrs&) {
    const ScanDims d = scan_dims("ssm_scan_back", in, 1);
    const TensorImpl& g = *in[0];
    if (g.dtype != in[2]->dtype || g.numel() != d.y_size() + d.final_size())
        throw std::invalid_argument(op_err("ssm_scan_back", "the gradient must match ssm_scan's output: " +
                                                                std::to_string(d.y_size() + d.final_size()) + " " +
                                                                dtype_name(in[2]->dtype) + " elements, got " + g.shape_str() +
                                                                " " + dtype_name(g.dtype)));
    return OutSpec{{d.backward_size(), 1, 1, 1}, 2, g.dtype};
}

void cpu_ssm_scan_back(const Inputs& in, const OpAttrs&, TensorImpl& out) {
    const ScanDims d = scan_dims("ssm_scan_back", in, 1);
    check_ids("ssm_scan_back", *in[7], d);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const ScanInputs<T> si = scan_inputs<T>(d, in, 1);
        const T* g = in[0]->ptr<T>();
        T* po = out.ptr<T>();
        parallel_for(d.tasks(), task_grain(d), [&](int64_t lo, int64_t hi) {
            std::vector<T> scratch(cpu_scratch_size(d));
            for (int64_t task = lo; task < hi; ++task)
                scan_backward_task(si, g, po, scratch.data(), task / d.n_head, task % d.n_head);
        });
    });
}

}  // namespace rk
