// The elementwise ops by code, from their list (native/elementwise.def): unary.comp and binary.comp
// compile one op each (OP_CODE), and chain.comp runs a chain of them per element.

// op's value at x (and y, a binary op's or a backward helper's second input); p0, p1: its float
// attributes (scale's factor, pow's exponent, clamp's bounds, huber's delta, ...).
#define T float
float elementwise_value(uint op, float x, float y, float p0, float p1) {
    switch (op) {
#define RK_ELEMENTWISE(name, kind, code, n_floats, grad, value) case code: return value;
#include "elementwise.def"
#undef RK_ELEMENTWISE
    }
    return quiet_nan();
}
#undef T
