// Indexing by 0-based i32 indices. Indices given from the host are checked before they are
// uploaded; indices computed on the device are clamped into range here.
// GATHER:       out[0, j] = x[index[j], j]
// ONE_HOT:      out[r, j] = (index[j] == r)
// GET_ROWS:     out[:, j] = x[:, index[j]]          (any 4-byte dtype)
// SCATTER_COLS: out[:, c] = sum of g[:, j] over j with index[j] == c, in order of j
// PUT_COLS:     o[:, index[j]] = x[:, j] in place (x: the values, o: the target; total = rows)
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Words x;
    Ints index;
    Words o;
    uint rows;     // rows of x (GATHER, GET_ROWS, SCATTER_COLS) or classes (ONE_HOT)
    uint limit;    // valid indices are 0 .. limit - 1
    uint n_index;
    uint total;    // elements of out
} pc;

uint checked(int i) { return uint(clamp(i, 0, int(pc.limit) - 1)); }

void main() {
    uint e = flat_invocation();
    if (e >= pc.total) return;
#if defined(GATHER)
    pc.o.v[e] = pc.x.v[checked(pc.index.v[e]) + e * pc.rows];
#elif defined(ONE_HOT)
    uint r = e % pc.rows, j = e / pc.rows;
    pc.o.v[e] = floatBitsToUint(checked(pc.index.v[j]) == r ? 1.0 : 0.0);
#elif defined(GET_ROWS)
    uint r = e % pc.rows, j = e / pc.rows;
    pc.o.v[e] = pc.x.v[r + checked(pc.index.v[j]) * pc.rows];
#elif defined(PUT_COLS)
    // invocation e copies row e of every values column, in order of j (a later index wins)
    for (uint j = 0; j < pc.n_index; ++j)
        pc.o.v[e + checked(pc.index.v[j]) * pc.rows] = pc.x.v[e + j * pc.rows];
#elif defined(SCATTER_COLS)
    uint r = e % pc.rows, c = e / pc.rows;
    float s = 0.0;
    for (uint j = 0; j < pc.n_index; ++j)
        if (checked(pc.index.v[j]) == c) s += uintBitsToFloat(pc.x.v[r + j * pc.rows]);
    pc.o.v[e] = floatBitsToUint(s);
#endif
}
