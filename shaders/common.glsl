// Shared by every rlkit shader: tensors are addressed by buffer device address (no
// descriptors, no binding-size limits), shapes and scalars travel in push constants
// (at most 128 bytes), and a long 1-D dispatch is folded into (x, y) workgroups by the host.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

// Every rlkit shader runs 256 invocations per workgroup (declared here, before anything below
// reads gl_WorkGroupSize).
layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Ints { int v[]; };

// The workgroup's index in the folded (x, y) grid.
uint flat_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// This invocation's index in the folded grid.
uint flat_invocation() { return flat_group() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; }

// array[at] where `inside`, else 0: read without a branch (an element outside reads the array's
// first). NVIDIA's compiler waits for a load inside a branch where the branch joins, so a staging
// loop's loads written as branches go one after another.
float element(Floats array, uint at, bool inside) {
    float v = array.v[inside ? at : 0];
    return inside ? v : 0.0;
}

// The functions the values of the elementwise ops call (native/elementwise.def), each defined alike
// in native/kernel_util.hpp; the activations among them are the fused linear op's too.

// NaN propagates (GLSL's max(x, 0.0) may return 0 there), as in numpy.
float relu_of(float x) { return (x > 0.0 || isnan(x)) ? x : 0.0; }

float sigmoid_of(float x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    float e = exp(x);
    return e / (1.0 + e);
}

float tanh_of(float x) {
    float e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

float quiet_nan() { return uintBitsToFloat(0x7fc00000u); }
float infinity() { return uintBitsToFloat(0x7f800000u); }

// C's: NaN below 0 and -inf at 0 (GLSL's log and sqrt are undefined below 0, log at 0 too).
float log_of(float x) { return x < 0.0 ? quiet_nan() : (x == 0.0 ? -infinity() : log(x)); }
float sqrt_of(float x) { return x < 0.0 ? quiet_nan() : sqrt(x); }
float log1p_of(float x) { return log(1.0 + x); }  // GLSL has no log1p

// x ** p as C's pow: negative bases with integer exponents, and 0 ** p, are defined there
// (GLSL's pow is undefined for x < 0 and for x = 0, p <= 0).
float pow_of(float x, float p) {
    if (p == 0.0) return 1.0;
    if (x == 0.0) return p > 0.0 ? 0.0 : infinity();
    float r = pow(abs(x), p);
    if (x > 0.0) return r;
    if (p != floor(p)) return quiet_nan();
    return mod(p, 2.0) == 1.0 ? -r : r;
}

// min/max that propagate NaN (GLSL leaves them undefined there), as numpy does.
float nan_min(float a, float b) { return (isnan(a) || isnan(b)) ? a + b : min(a, b); }
float nan_max(float a, float b) { return (isnan(a) || isnan(b)) ? a + b : max(a, b); }

// The fused linear op's activation (0 none, 1 relu, 2 tanh, 3 sigmoid), through the functions
// the unfused ops use, so a fused layer gives what they give, NaN included.
float linear_activation(uint activation, float z) {
    if (activation == 1u) return relu_of(z);
    if (activation == 2u) return tanh_of(z);
    if (activation == 3u) return sigmoid_of(z);
    return z;
}
