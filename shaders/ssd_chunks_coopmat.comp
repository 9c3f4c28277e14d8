// ssd_chunks.glsl's backward kernels (GRADS, OWN_STATES, START_GRADS) on cooperative matrices:
// their products' operands rounded to f16 or (variant BF16) bf16, f32 sums. Used where the op asks
// for 16-bit products and the device lists those fragments (vk_sequence_kernels.cpp).
#version 450
#if defined(KHR_COOPMAT)
#extension GL_KHR_cooperative_matrix : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require  // glslangValidator does not imply it, as glslc does
#if defined(BF16)
#extension GL_EXT_bfloat16 : require
#define ELEMENT bfloat16_t
#else
#define ELEMENT float16_t
#endif
#include "coopmat.glsl"
#define COOPMAT
#include "ssd_chunks.glsl"
