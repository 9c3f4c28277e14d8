#include "tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <unistd.h>

#include "host_cache.hpp"
#include "ops.hpp"

namespace rk {

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::f32: return 4;
        case DType::f16: return 2;
        case DType::i32: return 4;
        case DType::f64: return 8;
        case DType::u8: return 1;
        case DType::bf16: return 2;
    }
    throw std::logic_error("unknown dtype");
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::f32: return "f32";
        case DType::f16: return "f16";
        case DType::i32: return "i32";
        case DType::f64: return "f64";
        case DType::u8: return "u8";
        case DType::bf16: return "bf16";
    }
    return "?";
}

const char* device_name(Device device) { return device == Device::gpu ? "gpu" : "cpu"; }

DType dtype_from_name(const std::string& name) {
    if (name == "f32") return DType::f32;
    if (name == "f16") return DType::f16;
    if (name == "i32") return DType::i32;
    if (name == "f64") return DType::f64;
    if (name == "u8") return DType::u8;
    if (name == "bf16") return DType::bf16;
    throw std::invalid_argument("unknown dtype '" + name + "'; expected one of f32, f16, bf16, i32, f64, u8");
}

int64_t size_add(int64_t a, int64_t b) {
    int64_t sum;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &sum) || sum > kMaxTensorBytes)
        throw SizeError(std::to_string(a) + " + " + std::to_string(b) + " is more than 2^48, the most elements or "
                        "bytes a tensor may have");
    return sum;
}

int64_t size_mul(int64_t a, int64_t b) {
    int64_t product;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product) || product > kMaxTensorBytes)
        throw SizeError(std::to_string(a) + " * " + std::to_string(b) + " is more than 2^48, the most elements or "
                        "bytes a tensor may have");
    return product;
}

Extent checked_extent(const char* what, const Shape& ne, int ndim, DType dtype) {
    // The message's start, made only for a refusal (every tensor made passes here: a stream
    // formatted for each would cost more than the rest of a small tensor's making).
    const auto prefix = [&] {
        std::ostringstream shape;
        shape << "[";
        for (int d = 0; d < std::min(std::max(ndim, 2), kMaxDims); ++d) shape << (d ? ", " : "") << ne[d];
        shape << "]";
        return std::string(what) + ": shape " + shape.str() + " of " + dtype_name(dtype);
    };
    if (ndim < 2 || ndim > kMaxDims)  // a vector is one column: outputs and views have one shape for it
        throw SizeError(prefix() + ": a tensor has 2 to 4 dimensions, got ndim " + std::to_string(ndim));
    for (int d = 0; d < kMaxDims; ++d) {
        if (ne[d] < 1) throw SizeError(prefix() + ": every size must be at least 1, got " + std::to_string(ne[d]));
        if (d >= ndim && ne[d] != 1)
            throw SizeError(prefix() + ": sizes beyond ndim must be 1, got " + std::to_string(ne[d]));
    }
    // Left to right, so a partial product that passes the limit is refused before the next one
    // could overflow; the exact count goes into the message as a double.
    int64_t numel = 1, nbytes = 0;
    bool fits = true;
    for (int d = 0; d < kMaxDims && fits; ++d) fits = !__builtin_mul_overflow(numel, ne[d], &numel) && numel <= kMaxTensorBytes;
    fits = fits && !__builtin_mul_overflow(numel, int64_t(dtype_size(dtype)), &nbytes) && nbytes <= kMaxTensorBytes;
    if (!fits) {
        const double bytes = double(ne[0]) * double(ne[1]) * double(ne[2]) * double(ne[3]) * double(dtype_size(dtype));
        std::ostringstream os;
        os.precision(3);
        os << prefix() << " would take about " << bytes << " bytes, more than 2^48 (256 TiB), the most a tensor may take";
        throw SizeError(os.str());
    }
    return {numel, size_t(nbytes)};
}

namespace {
std::atomic<bool> host_poison{false};
}  // namespace

void set_host_poison(bool on) { host_poison.store(on); }

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, bool zero) {
    constexpr size_t kAlign = 64;
    size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    // More than the machine's physical memory can never be used: refuse it here, because with
    // memory overcommit the allocation itself may succeed and the process be killed on first touch.
    static const size_t physical = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
    if (rounded > physical)
        throw OutOfMemory("out of host memory: a tensor of " + std::to_string(rounded >> 20) + " MiB is larger than "
                          "this machine's " + std::to_string(physical >> 20) + " MiB of memory");
    void* p = host_block_acquire(rounded);
    if (!p)
        throw OutOfMemory("out of host memory: could not allocate " + std::to_string(rounded >> 20) +
                          " MiB for a tensor; free tensors or buffers, or use smaller ones");
    if (zero)
        std::memset(p, 0, rounded);
    else if (host_poison.load(std::memory_order_relaxed))
        std::memset(p, 0xff, rounded);  // NaN in every float dtype: what a kernel leaves unwritten shows
    auto s = std::make_shared<Storage>();
    s->data = p;
    s->nbytes = nbytes;
    s->keep_alive = std::shared_ptr<void>(p, [rounded](void* q) { host_block_release(q, rounded); });
    return s;
}

void* TensorImpl::data() const {
    if (!storage) throw std::runtime_error("tensor " + shape_str() + " is pending: the graph that computes it has not run");
    if (storage->device != Device::cpu)
        throw std::runtime_error("tensor " + shape_str() + " is on the GPU: its values are read with numpy()");
    return static_cast<char*>(storage->data) + offset;
}

uint64_t TensorImpl::address() const {
    if (!storage) throw std::runtime_error("tensor " + shape_str() + " is pending: the graph that computes it has not run");
    if (storage->device != Device::gpu) throw std::logic_error("address() of a CPU tensor");
    return storage->address + offset;
}

std::string TensorImpl::shape_str() const {
    std::ostringstream os;
    os << "[";
    for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << ne[d];
    os << "]";
    return os.str();
}

namespace {
std::atomic<uint64_t> all_host_writes{0};
}  // namespace

void TensorImpl::note_write() {
    ++version;
    all_host_writes.fetch_add(1, std::memory_order_relaxed);
}

uint64_t host_writes() { return all_host_writes.load(std::memory_order_relaxed); }

TensorPtr make_pending(const Shape& ne, int ndim, DType dtype, Device device, const char* what) {
    checked_extent(what, ne, ndim, dtype);
    auto t = std::make_shared<TensorImpl>();
    t->ne = ne;
    t->ndim = ndim;
    t->dtype = dtype;
    t->device = device;
    return t;
}

TensorPtr make_tensor(const Shape& ne, int ndim, DType dtype, bool zero) {
    auto t = make_pending(ne, ndim, dtype);
    t->storage = Storage::allocate(t->nbytes(), zero);
    return t;
}

uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mant = x & 0x7fffffu;
    int32_t exp = int32_t((x >> 23) & 0xffu);
    if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));  // inf / nan
    exp = exp - 127 + 15;
    if (exp >= 0x1f) return uint16_t(sign | 0x7c00u);  // overflow to inf
    if (exp <= 0) {
        if (exp < -10) return uint16_t(sign);  // underflow to zero
        mant |= 0x800000u;
        uint32_t shift = uint32_t(14 - exp);
        uint32_t half_mant = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
        return uint16_t(sign | half_mant);
    }
    uint32_t half = sign | (uint32_t(exp) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
    return uint16_t(half);
}

float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; --exp; }
            x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

uint16_t float_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // NaN: keep it a (quiet) NaN
    x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even; overflows to inf as it should
    return uint16_t(x >> 16);
}

}  // namespace rk
