// A chain of elementwise ops in one pass (a captured GPU program fuses runs of unary and binary
// ops into it): each step applies an op (elementwise.glsl's codes) to the value so far and/or
// the chain's inputs; the last step's value is the output. Inputs have the output's elements or
// one element (bit k of scalar_mask: read element 0 of input k everywhere).
#version 450
#include "common.glsl"
#include "elementwise.glsl"

struct Step {
    uint op;
    int a;  // an input's index, or -1: the value so far
    int b;  // likewise; binary ops only
    float p0;
    float p1;
};

layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Steps { Step step[]; };

layout(push_constant) uniform Push {
    Floats inputs[8];
    Floats o;
    Steps steps;
    uint n;
    uint n_steps;
    uint scalar_mask;
} pc;

float operand(int which, float value, uint i) {
    if (which < 0) return value;
    uint k = uint(which);
    return pc.inputs[k].v[((pc.scalar_mask >> k) & 1u) != 0u ? 0u : i];
}

void main() {
    uint i = flat_invocation();
    if (i >= pc.n) return;
    float value = 0.0;
    for (uint s = 0u; s < pc.n_steps; ++s) {
        Step step = pc.steps.step[s];
        float x = operand(step.a, value, i);
        value = elementwise_value(step.op, x, operand(step.b, value, i), step.p0, step.p1);  // a unary op ignores y
    }
    pc.o.v[i] = value;
}
