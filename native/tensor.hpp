// Tensors of the native engine: up to 4 dimensions, column-major (ne[0] contiguous), one dtype.
// A tensor owns a reference to its storage; a tensor made while a graph is recording has no
// storage until that graph runs (it is "pending").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

namespace rk {

// u8: buffer storage (frames); f16 and bf16: float storage formats (ops compute them in f32)
enum class DType : int { f32 = 0, f16 = 1, i32 = 2, f64 = 3, u8 = 4, bf16 = 5 };
enum class Device : int { cpu = 0, gpu = 1 };
const char* device_name(Device device);

const char* dtype_name(DType dtype);
DType dtype_from_name(const std::string& name);
inline bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }  // the 16-bit float formats
inline bool is_float(DType d) { return d == DType::f32 || d == DType::f64 || is_half(d); }

constexpr int kMaxDims = 4;
using Shape = std::array<int64_t, kMaxDims>;  // ne[0..3]; unused trailing dims are 1

// Every size of the engine is computed here, with overflow checks. A tensor holds at most
// kMaxTensorBytes (2^48 bytes, 256 TiB: more than any machine's memory, and all that x86-64 and
// AArch64 processes can address), so a size any shape rule derives (elements or bytes) is at most
// that too: a few such sizes add up without overflowing int64, and sizes that would multiply
// past it are refused before anything is allocated.
constexpr int64_t kMaxTensorBytes = int64_t(1) << 48;

// A size that overflows or passes kMaxTensorBytes; a std::invalid_argument, so Python's
// ValueError. apply() adds the op's name and its inputs' shapes to those a shape rule throws.
struct SizeError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// The sum and the product of sizes (each >= 0); SizeError when the result passes kMaxTensorBytes.
int64_t size_add(int64_t a, int64_t b);
int64_t size_mul(int64_t a, int64_t b);
template <typename... More>
int64_t size_add(int64_t a, int64_t b, More... more) { return size_add(size_add(a, b), more...); }
template <typename... More>
int64_t size_mul(int64_t a, int64_t b, More... more) { return size_mul(size_mul(a, b), more...); }

size_t dtype_size(DType dtype);

// The element and byte counts of a tensor [ne[0], ..., ne[ndim - 1]] of `dtype`, checked: ndim 2..4
// (a vector is one column), every size at least 1 (1 beyond ndim), the bytes at most kMaxTensorBytes.
// Throws SizeError naming `what` (an op) and the shape.
struct Extent {
    int64_t numel;
    size_t nbytes;
};
Extent checked_extent(const char* what, const Shape& ne, int ndim, DType dtype);

// A block of memory on a device: host memory (`data`) on the CPU, a range of device memory
// (`address`, a Vulkan buffer device address) on the GPU. `keep_alive` holds whatever owns it
// (an aligned allocation, a numpy array shared without a copy, a device sub-allocation).
struct Storage {
    Device device = Device::cpu;
    void* data = nullptr;
    uint64_t address = 0;
    size_t nbytes = 0;
    std::shared_ptr<void> keep_alive;

    // 64-byte aligned; uninitialised unless `zero`.
    static std::shared_ptr<Storage> allocate(size_t nbytes, bool zero = false);
};

struct Node;

struct TensorImpl {
    Shape ne{1, 1, 1, 1};
    int ndim = 2;  // 2..4; a 1-D input becomes one column
    DType dtype = DType::f32;
    Device device = Device::cpu;
    std::shared_ptr<Storage> storage;  // null while pending
    size_t offset = 0;                 // bytes into storage
    uint64_t version = 0;              // bumped by every in-place write (note_write)

    // Unchecked products: make_pending checked this shape (checked_extent) when it made the tensor.
    int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
    bool pending() const { return !storage; }
    void* data() const;  // host memory (CPU tensors only)
    uint64_t address() const;  // device address (GPU tensors only)
    template <typename T> T* ptr() const { return static_cast<T*>(data()); }
    std::string shape_str() const;
    // Counts an in-place write: one more version of this tensor, one more of host_writes().
    void note_write();
};
using TensorPtr = std::shared_ptr<TensorImpl>;

// In-place writes to any tensor so far (note_write): equal counts mean that no tensor's version
// changed in between, which a captured call's check of its parameters reads in one call.
uint64_t host_writes();

// Tests: fill every new host block that is not zeroed with 0xff bytes (NaN in every float dtype),
// so that output elements a CPU kernel leaves unwritten show, whether the block is new or reused.
void set_host_poison(bool on);

// A new tensor with its own storage (uninitialised unless `zero`).
TensorPtr make_tensor(const Shape& ne, int ndim, DType dtype, bool zero = false);
// A new pending tensor (storage assigned later by a graph). Every tensor is made here: its shape
// is checked (checked_extent; errors name `what`), so numel() and nbytes() cannot overflow.
TensorPtr make_pending(const Shape& ne, int ndim, DType dtype, Device device = Device::cpu,
                       const char* what = "tensor");

// Half-precision conversion (IEEE 754 binary16, round to nearest even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
// bfloat16 conversion (f32's upper 16 bits, round to nearest even; NaN stays a quiet NaN).
uint16_t float_to_bf16(float f);
inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

}  // namespace rk
