// The elementwise ops by code: unary.comp and binary.comp compile one op each (OP_CODE), and
// chain.comp runs a chain of them per element (native/elementwise_chain.cpp lists the same
// codes). Codes below 16 are binary (x op y, or a backward helper's (g, saved)), the rest unary.
const uint EW_ADD = 0u;
const uint EW_SUB = 1u;
const uint EW_MUL = 2u;
const uint EW_DIV = 3u;
const uint EW_MINIMUM = 4u;
const uint EW_MAXIMUM = 5u;
const uint EW_GE = 6u;
const uint EW_GT = 7u;
const uint EW_RELU_BACK = 8u;
const uint EW_SIGMOID_BACK = 9u;
const uint EW_TANH_BACK = 10u;
const uint EW_SILU_BACK = 11u;
const uint EW_CLAMP_BACK = 12u;
const uint EW_NEG = 16u;
const uint EW_RELU = 17u;
const uint EW_SIGMOID = 18u;
const uint EW_TANH = 19u;
const uint EW_SOFTPLUS = 20u;
const uint EW_SILU = 21u;
const uint EW_EXP = 22u;
const uint EW_LOG = 23u;
const uint EW_SQRT = 24u;
const uint EW_SQUARE = 25u;
const uint EW_ABS = 26u;
const uint EW_SIGN = 27u;
const uint EW_SCALE = 28u;
const uint EW_POW = 29u;
const uint EW_CLAMP = 30u;
const uint EW_HUBER = 31u;

// x (op) y; p0, p1: clamp_back's bounds.
float binary_value(uint op, float x, float y, float p0, float p1) {
    switch (op) {
        case EW_ADD: return x + y;
        case EW_SUB: return x - y;
        case EW_MUL: return x * y;
        case EW_DIV: return x / y;
        case EW_MINIMUM: return nan_min(x, y);
        case EW_MAXIMUM: return nan_max(x, y);
        case EW_GE: return x >= y ? 1.0 : 0.0;
        case EW_GT: return x > y ? 1.0 : 0.0;
        case EW_RELU_BACK: return y > 0.0 ? x : 0.0;
        case EW_SIGMOID_BACK: return x * y * (1.0 - y);
        case EW_TANH_BACK: return x * (1.0 - y * y);
        case EW_SILU_BACK: {
            float s = sigmoid_of(y);
            return x * s * (1.0 + y * (1.0 - s));
        }
        case EW_CLAMP_BACK: return (y > p0 && y < p1) ? x : 0.0;
    }
    return quiet_nan();
}

// op(x); p0, p1: scale's factor, pow's exponent, clamp's bounds, huber's delta.
float unary_value(uint op, float x, float p0, float p1) {
    switch (op) {
        case EW_NEG: return -x;
        case EW_RELU: return relu_of(x);
        case EW_SIGMOID: return sigmoid_of(x);
        case EW_TANH: return safe_tanh(x);
        case EW_SOFTPLUS: return max(x, 0.0) + log(1.0 + exp(-abs(x)));
        case EW_SILU: return x * sigmoid_of(x);
        case EW_EXP: return exp(x);
        case EW_LOG: return x < 0.0 ? quiet_nan() : (x == 0.0 ? -infinity() : log(x));
        case EW_SQRT: return x < 0.0 ? quiet_nan() : sqrt(x);
        case EW_SQUARE: return x * x;
        case EW_ABS: return abs(x);
        case EW_SIGN: return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0);
        case EW_SCALE: return x * p0;
        case EW_POW: return c_pow(x, p0);
        case EW_CLAMP: return isnan(x) ? x : clamp(x, p0, p1);
        case EW_HUBER: return abs(x) <= p0 ? 0.5 * x * x : p0 * (abs(x) - 0.5 * p0);
    }
    return quiet_nan();
}
