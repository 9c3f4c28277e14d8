// ssm_scan's chunked form (SSD): ssd_chunks.glsl, in f32.
#version 450
#include "ssd_chunks.glsl"
