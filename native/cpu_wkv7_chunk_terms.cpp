// wkv7_chunk_terms: what each chunk of rwkv_wkv7's chunked form (rlkit/core/recurrences.py,
// _chunked_wkv7) computes from its own tokens, everything but the state it starts from: one op
// where composed ops took about a hundred dependency levels (four decayed pairs, the triangular
// solve as log2(L) products, the decays and their products, a layout copy of every input). Its
// inputs are the recurrence's own, r, k, v, a, b, log_decay [S, H, T] (S channels, H heads, T
// tokens of n_seqs equal sequences), ints (L, n_seqs): chunks of L tokens, the last of each
// sequence padded with tokens of no input and decay 1. The chunks' batch B = H n_seqs c (c chunks
// per sequence) runs head fastest, then sequence, then chunk (wkv7_chunk_states' order). Per
// chunk, with X(s, t)[j] = exp(sum of log_decay[j, u] over s < u <= t) (1 where t = s; each a
// running sum from s, never a difference of two, so no exponent is above 0) and
// start(t) = exp(sum over u <= t), the decay from the chunk's start through token t:
//   P_ab[t, s] = sum_j a[j, t] b[j, s] X(s, t-1)[j],  P_ak likewise with k   (s < t)
//   Q_rb[t, s] = sum_j r[j, t] b[j, s] X(s, t)[j],    Q_rk likewise with k   (s <= t)
//   A0[t] = a[t] start(t-1),  Rf[t] = r[t] start(t),  Be[s] = b[s] X(s, L-1),  Ke[s] = k[s] X(s, L-1)
//   W = (I - P_ab)^-1 A0,  U = (I - P_ab)^-1 (P_ak V)   (forward substitution: P_ab is strictly lower)
//   decay = start(L-1)
// so that with Z the state [key, value] at the chunk's start, the tokens' sa are W Z + U, the
// outputs Rf Z + Q_rb (W Z + U) + Q_rk V and the next state decay * Z + Be^T (W Z + U) + Ke^T V.
// Output one column: W, U, Be, Ke, Rf, V [L, S, B] (tokens in rows, as the products take them; V
// the chunk's values), then Q_rb, Q_rk [L(t), L(s), B], then decay [S, B], then P_ab, P_ak
// [L(t), L(s), B] (0 where s >= t), which the chunked form does not read: they are kept for the
// backward, which made them again.
//
// wkv7_chunk_terms_back (g like the output, r, k, v, a, b, log_decay, the forward's output; the
// same ints) -> a column [gr, gk, gv, ga, gb, glog_decay], each [S, H, T]. With T = (I - P_ab)^-1
// (P_ab and P_ak read from the forward's output):
//   gA0 = T^T gW,  gPV = T^T gU   (back substitution),  gV = P_ak^T gPV + g of the V rows
//   gP_ab = gA0 W^T + gPV U^T + g of P_ab,  gP_ak = gPV V^T + g of P_ak   (their strictly lower parts)
// then each pair's and each decayed input's terms per channel; glog_decay[u] sums the terms of
// every decay whose range holds u: per s, suffix sums over t.
// The CPU loops run over the channels (consecutive in memory: they vectorise); the GPU's kernels
// are shaders/wkv7_chunk_terms.comp.
#include <string>
#include <vector>

#include "kernel_util.hpp"

namespace rk {
namespace {

const char* const kTermArgNames[] = {"r", "k", "v", "a", "b", "log_decay"};

struct TermDims {
    int64_t S, H, T, n_seqs, L;
    int64_t n_tok() const { return T / n_seqs; }  // per sequence
    int64_t chunks() const { return (n_tok() + L - 1) / L; }  // per sequence
    int64_t B() const { return H * chunks() * n_seqs; }
    int64_t block() const { return S * L * B(); }  // one of W, U, Be, Ke, Rf, V
    int64_t pairs() const { return L * L * B(); }  // one of Q_rb, Q_rk, P_ab, P_ak
    int64_t kept_pairs() const { return 6 * block() + 2 * pairs() + S * B(); }  // where P_ab starts
    int64_t total() const { return kept_pairs() + 2 * pairs(); }
    int64_t input() const { return S * H * T; }
    // Chunk ch's token l as a token of the inputs, or -1 for the padding.
    int64_t token(int64_t ch, int64_t l) const {
        const int64_t n = (ch / H) % n_seqs, q = ch / (H * n_seqs), at = q * L + l;
        return at < n_tok() ? n * n_tok() + at : -1;
    }
    // The element offset of chunk ch's token l (not padding) in an input.
    int64_t input_at(int64_t ch, int64_t l) const { return (ch % H + H * token(ch, l)) * S; }
};

// Checks (r, k, v, a, b, log_decay) at in[first..] and the ints (L, n_seqs); returns the sizes.
TermDims term_dims(const char* op, const Inputs& in, size_t first, const OpAttrs& attrs) {
    require_same_float_inputs(op, in, first, {"r", "k", "v", "a", "b", "log_decay"});
    const TensorImpl& r = *in[first];
    for (size_t x = 0; x < 6; ++x) {
        const TensorImpl& t = *in[first + x];
        if (t.ne != r.ne || t.ne[3] != 1)
            throw std::invalid_argument(op_err(op, std::string(kTermArgNames[x]) + " must be [S, H, T] like r " +
                                                       r.shape_str() + ", got " + t.shape_str()));
    }
    if (attrs.ints.size() != 2 || attrs.ints[0] < 1 || attrs.ints[1] < 1)
        throw std::invalid_argument(op_err(op, "expected two int attributes, L (tokens per chunk) and n_seqs, each at least 1"));
    const TermDims d{r.ne[0], r.ne[1], r.ne[2], attrs.ints[1], attrs.ints[0]};
    if (d.T % d.n_seqs != 0)
        throw std::invalid_argument(op_err(op, std::to_string(d.T) + " tokens do not split into " + std::to_string(d.n_seqs) +
                                                   " sequences of equal length"));
    const int64_t B = size_mul(d.H, d.chunks(), d.n_seqs);
    size_add(size_mul(6, d.S, d.L, B), size_mul(4, d.L, d.L, B), size_mul(d.S, B));  // checked before use
    return d;
}

// One chunk's inputs, channel-major: x(t)[j] at t * S + j, zeros for the padding's tokens (whose
// log decay 0 is a decay of 1).
template <typename T>
struct ChunkInputs {
    const TermDims& d;
    std::vector<T> r, k, v, a, b, log_decay;
    explicit ChunkInputs(const TermDims& dims)
        : d(dims), r(d.L * d.S), k(d.L * d.S), v(d.L * d.S), a(d.L * d.S), b(d.L * d.S), log_decay(d.L * d.S) {}
    void gather(const Inputs& in, size_t first, int64_t ch) {
        std::vector<T>* x[] = {&r, &k, &v, &a, &b, &log_decay};
        for (size_t i = 0; i < 6; ++i) {
            const T* src = in[first + i]->ptr<T>();
            for (int64_t l = 0; l < d.L; ++l) {
                T* row = x[i]->data() + l * d.S;
                if (d.token(ch, l) < 0) std::fill_n(row, d.S, T(0));
                else std::copy_n(src + d.input_at(ch, l), d.S, row);
            }
        }
    }
};

template <typename T>
void multiply(int64_t n, const T* __restrict x, const T* __restrict y, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * y[i];
}

template <typename T>
void add_to(int64_t n, const T* __restrict x, T* __restrict out) {
    for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

// Per chunk, the work vectors of one worker, channel-major [L][S] or [S].
template <typename T>
struct ChunkWork {
    const TermDims& d;
    std::vector<T> sum, X, bx, kx, start, P_ab, P_ak;
    explicit ChunkWork(const TermDims& dims)
        : d(dims), sum(d.S), X(d.S), bx(d.S), kx(d.S), start(d.L * d.S), P_ab(d.L * d.L), P_ak(d.L * d.L) {}
    const T* start_at(int64_t t) const { return start.data() + t * d.S; }

    // start(t) for every token: the running sum of the log decays from the chunk's start.
    void start_decays(const T* log_decay) {
        std::fill(sum.begin(), sum.end(), T(0));
        for (int64_t t = 0; t < d.L; ++t) {
            add_to(d.S, log_decay + t * d.S, sum.data());
            for (int64_t j = 0; j < d.S; ++j) start[t * d.S + j] = exp_of(sum[j]);
        }
    }

    // Walks the pairs (t, s), t from s on, calling visit(s, t) with X = X(s, t); with fill_pairs
    // also bx = b[s] X and kx = k[s] X, and first fills P_ab[t + 1, s] and P_ak[t + 1, s] (0 where
    // s >= t). The backward's walk needs only X: its pairs are the forward's.
    template <typename F>
    void walk_pairs(const ChunkInputs<T>& x, bool fill_pairs, F&& visit) {
        if (fill_pairs) {
            std::fill(P_ab.begin(), P_ab.end(), T(0));
            std::fill(P_ak.begin(), P_ak.end(), T(0));
        }
        for (int64_t s = 0; s < d.L; ++s) {
            std::fill(sum.begin(), sum.end(), T(0));
            for (int64_t t = s; t < d.L; ++t) {
                if (t > s) add_to(d.S, x.log_decay.data() + t * d.S, sum.data());
                for (int64_t j = 0; j < d.S; ++j) X[j] = exp_of(sum[j]);
                if (fill_pairs) {
                    multiply(d.S, x.b.data() + s * d.S, X.data(), bx.data());
                    multiply(d.S, x.k.data() + s * d.S, X.data(), kx.data());
                    if (t + 1 < d.L) {
                        P_ab[t + 1 + s * d.L] = dot(x.a.data() + (t + 1) * d.S, bx.data(), d.S);
                        P_ak[t + 1 + s * d.L] = dot(x.a.data() + (t + 1) * d.S, kx.data(), d.S);
                    }
                }
                visit(s, t);
            }
        }
    }
};

// out[t + j L] = m[t S + j]: a channel-major [L][S] block written tokens in rows.
template <typename T>
void store_rows(const TermDims& d, const T* m, T* out) {
    for (int64_t j = 0; j < d.S; ++j)
        for (int64_t t = 0; t < d.L; ++t) out[t + j * d.L] = m[t * d.S + j];
}

template <typename T>
void load_rows(const TermDims& d, const T* rows, T* m) {
    for (int64_t j = 0; j < d.S; ++j)
        for (int64_t t = 0; t < d.L; ++t) m[t * d.S + j] = rows[t + j * d.L];
}

}  // namespace

OutSpec shape_wkv7_chunk_terms(const Inputs& in, const OpAttrs& attrs) {
    const TermDims d = term_dims("wkv7_chunk_terms", in, 0, attrs);
    return OutSpec{{d.total(), 1, 1, 1}, 2, in[0]->dtype};
}

void cpu_wkv7_chunk_terms(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TermDims d = term_dims("wkv7_chunk_terms", in, 0, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = out.ptr<T>();
        T *W = o, *U = W + d.block(), *Be = U + d.block(), *Ke = Be + d.block(), *Rf = Ke + d.block(), *V = Rf + d.block();
        T *Q_rb = V + d.block(), *Q_rk = Q_rb + d.pairs(), *decay = Q_rk + d.pairs();
        T *P_ab = o + d.kept_pairs(), *P_ak = P_ab + d.pairs();
        parallel_for(d.B(), std::max<int64_t>(1, kElementGrain / (d.S * d.L * d.L)), [&](int64_t lo, int64_t hi) {
            ChunkWork<T> w(d);
            ChunkInputs<T> x(d);
            std::vector<T> Wm(d.L * d.S), Um(d.L * d.S), Bm(d.L * d.S), Km(d.L * d.S), Rm(d.L * d.S);
            for (int64_t c = lo; c < hi; ++c) {
                x.gather(in, 0, c);
                const int64_t block = c * d.L * d.S, pairs = c * d.L * d.L;
                std::fill_n(Q_rb + pairs, d.L * d.L, T(0));
                std::fill_n(Q_rk + pairs, d.L * d.L, T(0));
                w.start_decays(x.log_decay.data());
                w.walk_pairs(x, true, [&](int64_t s, int64_t t) {
                    Q_rb[pairs + t + s * d.L] = dot(x.r.data() + t * d.S, w.bx.data(), d.S);
                    Q_rk[pairs + t + s * d.L] = dot(x.r.data() + t * d.S, w.kx.data(), d.S);
                    if (t == d.L - 1) {
                        std::copy_n(w.bx.data(), d.S, Bm.data() + s * d.S);
                        std::copy_n(w.kx.data(), d.S, Km.data() + s * d.S);
                    }
                });
                for (int64_t t = 0; t < d.L; ++t) {
                    T* W_t = Wm.data() + t * d.S;
                    T* U_t = Um.data() + t * d.S;
                    if (t == 0) std::copy_n(x.a.data(), d.S, W_t);
                    else multiply(d.S, x.a.data() + t * d.S, w.start_at(t - 1), W_t);  // A0[t]
                    multiply(d.S, x.r.data() + t * d.S, w.start_at(t), Rm.data() + t * d.S);
                    std::fill_n(U_t, d.S, T(0));
                    for (int64_t s = 0; s < t; ++s) add_scaled(d.S, w.P_ak[t + s * d.L], x.v.data() + s * d.S, U_t);
                    for (int64_t s = 0; s < t; ++s) {  // the forward substitution
                        add_scaled(d.S, w.P_ab[t + s * d.L], Wm.data() + s * d.S, W_t);
                        add_scaled(d.S, w.P_ab[t + s * d.L], Um.data() + s * d.S, U_t);
                    }
                }
                store_rows(d, Wm.data(), W + block);
                store_rows(d, Um.data(), U + block);
                store_rows(d, Bm.data(), Be + block);
                store_rows(d, Km.data(), Ke + block);
                store_rows(d, Rm.data(), Rf + block);
                store_rows(d, x.v.data(), V + block);
                std::copy_n(w.start_at(d.L - 1), d.S, decay + c * d.S);
                std::copy_n(w.P_ab.data(), d.L * d.L, P_ab + pairs);
                std::copy_n(w.P_ak.data(), d.L * d.L, P_ak + pairs);
            }
        });
    });
}

OutSpec shape_wkv7_chunk_terms_back(const Inputs& in, const OpAttrs& attrs) {
    const char* op = "wkv7_chunk_terms_back";
    const TermDims d = term_dims(op, in, 1, attrs);
    require_packed_output(op, *in[0], "g", *in[1], "r", d.total());
    require_packed_output(op, *in[7], "out", *in[1], "r", d.total());
    return OutSpec{{size_mul(6, d.input()), 1, 1, 1}, 2, in[1]->dtype};
}

void cpu_wkv7_chunk_terms_back(const Inputs& in, const OpAttrs& attrs, TensorImpl& out) {
    const TermDims d = term_dims("wkv7_chunk_terms_back", in, 1, attrs);
    dispatch_float(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* g = in[0]->ptr<T>();
        const T *gW = g, *gU = gW + d.block(), *gBe = gU + d.block(), *gKe = gBe + d.block(), *gRf = gKe + d.block();
        const T *gV = gRf + d.block(), *gQ_rb = gV + d.block(), *gQ_rk = gQ_rb + d.pairs(), *gdecay = gQ_rk + d.pairs();
        const T *gP_ab_out = g + d.kept_pairs(), *gP_ak_out = gP_ab_out + d.pairs();
        const T *W = in[7]->ptr<T>(), *U = W + d.block();
        const T *P_ab = W + d.kept_pairs(), *P_ak = P_ab + d.pairs();
        T* o = out.ptr<T>();
        parallel_for(d.B(), std::max<int64_t>(1, kElementGrain / (d.S * d.L * d.L)), [&](int64_t lo, int64_t hi) {
            ChunkWork<T> w(d);
            ChunkInputs<T> x(d);
            const int64_t LS = d.L * d.S;
            std::vector<T> Wm(LS), Um(LS), gA0(LS), gPV(LS), gBm(LS), gKm(LS), gRm(LS), m(LS), acc(d.S);
            std::vector<T> grads(6 * LS);  // gr, gk, gv, ga, gb, glog_decay, channel-major
            std::vector<T> gP_ab(d.L * d.L), gP_ak(d.L * d.L);
            for (int64_t c = lo; c < hi; ++c) {
                x.gather(in, 1, c);
                const int64_t block = c * LS, pairs = c * d.L * d.L;
                std::fill(grads.begin(), grads.end(), T(0));
                T *gr_c = grads.data(), *gk_c = gr_c + LS, *gv_c = gk_c + LS, *ga_c = gv_c + LS, *gb_c = ga_c + LS;
                T* glog_c = gb_c + LS;
                load_rows(d, W + block, Wm.data());
                load_rows(d, U + block, Um.data());
                load_rows(d, gW + block, gA0.data());
                load_rows(d, gU + block, gPV.data());
                load_rows(d, gBe + block, gBm.data());
                load_rows(d, gKe + block, gKm.data());
                load_rows(d, gRf + block, gRm.data());
                load_rows(d, gV + block, gv_c);
                w.start_decays(x.log_decay.data());
                std::copy_n(P_ab + pairs, d.L * d.L, w.P_ab.data());
                std::copy_n(P_ak + pairs, d.L * d.L, w.P_ak.data());
                for (int64_t t = d.L - 1; t >= 0; --t)  // the back substitution: G[t] += sum_{u > t} P[u, t] G[u]
                    for (int64_t u = t + 1; u < d.L; ++u) {
                        add_scaled(d.S, w.P_ab[u + t * d.L], gA0.data() + u * d.S, gA0.data() + t * d.S);
                        add_scaled(d.S, w.P_ab[u + t * d.L], gPV.data() + u * d.S, gPV.data() + t * d.S);
                    }
                std::fill(gP_ab.begin(), gP_ab.end(), T(0));
                std::fill(gP_ak.begin(), gP_ak.end(), T(0));
                for (int64_t s = 0; s < d.L; ++s)
                    for (int64_t t = s + 1; t < d.L; ++t) {
                        const T* gA0_t = gA0.data() + t * d.S;
                        const T* gPV_t = gPV.data() + t * d.S;
                        gP_ab[t + s * d.L] = dot(gA0_t, Wm.data() + s * d.S, d.S) + dot(gPV_t, Um.data() + s * d.S, d.S) +
                                             gP_ab_out[pairs + t + s * d.L];
                        gP_ak[t + s * d.L] = dot(gPV_t, x.v.data() + s * d.S, d.S) + gP_ak_out[pairs + t + s * d.L];
                        add_scaled(d.S, w.P_ak[t + s * d.L], gPV_t, gv_c + s * d.S);
                    }
                // the start decays: ga, gr, and each token's term of glog_decay, summed from the end
                std::fill(acc.begin(), acc.end(), T(0));
                for (int64_t t = d.L - 1; t >= 0; --t) {
                    const T* start_t = w.start_at(t);
                    const T* gR_t = gRm.data() + t * d.S;
                    for (int64_t j = 0; j < d.S; ++j) {
                        T term = gR_t[j] * x.r[t * d.S + j];
                        if (t + 1 < d.L) term += gA0[(t + 1) * d.S + j] * x.a[(t + 1) * d.S + j];
                        else term += gdecay[c * d.S + j];
                        acc[j] += start_t[j] * term;
                        gr_c[t * d.S + j] += gR_t[j] * start_t[j];
                        ga_c[t * d.S + j] += gA0[t * d.S + j] * (t > 0 ? w.start_at(t - 1)[j] : T(1));
                    }
                    add_to(d.S, acc.data(), glog_c + t * d.S);
                }
                // the pairs' terms, and Be's and Ke's, per channel; m[t] the decay X(s, t)'s term
                w.walk_pairs(x, false, [&](int64_t s, int64_t t) {
                    const T cqb = gQ_rb[pairs + t + s * d.L], cqk = gQ_rk[pairs + t + s * d.L];
                    const bool next = t + 1 < d.L, last = t == d.L - 1;
                    const T cpb = next ? gP_ab[t + 1 + s * d.L] : T(0), cpk = next ? gP_ak[t + 1 + s * d.L] : T(0);
                    const T *r_t = x.r.data() + t * d.S, *b_s = x.b.data() + s * d.S, *k_s = x.k.data() + s * d.S;
                    const T* a_n = x.a.data() + (next ? t + 1 : 0) * d.S;  // read only where next
                    T* m_t = m.data() + t * d.S;
                    for (int64_t j = 0; j < d.S; ++j) {
                        const T X = w.X[j];
                        const T wq = cqb * b_s[j] + cqk * k_s[j];
                        gr_c[t * d.S + j] += X * wq;
                        gb_c[s * d.S + j] += X * cqb * r_t[j];
                        gk_c[s * d.S + j] += X * cqk * r_t[j];
                        T term = r_t[j] * wq;
                        if (next) {
                            const T wp = cpb * b_s[j] + cpk * k_s[j];
                            ga_c[(t + 1) * d.S + j] += X * wp;
                            gb_c[s * d.S + j] += X * cpb * a_n[j];
                            gk_c[s * d.S + j] += X * cpk * a_n[j];
                            term += a_n[j] * wp;
                        }
                        if (last) {
                            const T gbe = gBm[s * d.S + j], gke = gKm[s * d.S + j];
                            gb_c[s * d.S + j] += X * gbe;
                            gk_c[s * d.S + j] += X * gke;
                            term += gbe * b_s[j] + gke * k_s[j];
                        }
                        m_t[j] = X * term;
                    }
                    if (last) {  // X(s, t)'s range holds u for s < u <= t: suffix sums over t
                        std::fill(acc.begin(), acc.end(), T(0));
                        for (int64_t u = d.L - 1; u > s; --u) {
                            add_to(d.S, m.data() + u * d.S, acc.data());
                            add_to(d.S, acc.data(), glog_c + u * d.S);
                        }
                    }
                });
                for (int64_t i = 0; i < 6; ++i)  // the chunk's tokens' gradients, the padding's dropped
                    for (int64_t l = 0; l < d.L; ++l)
                        if (d.token(c, l) >= 0)
                            std::copy_n(grads.data() + i * LS + l * d.S, d.S, o + i * d.input() + d.input_at(c, l));
            }
        });
    });
}

}  // namespace rk
