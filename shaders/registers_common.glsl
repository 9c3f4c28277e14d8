// Shared by the register recurrences (wkv7_registers.comp, recurrence_registers.comp): a quad of
// invocations (4 neighbouring lanes) per row or column of a head's state, lane `part` holding its
// elements part + 4m, and the rotated [i][j] shared array that carries sums across the other way.
#extension GL_KHR_shader_subgroup_quad : require

#define MAX_S 64u  // the largest head size: a quad per row or column, 16 elements a lane
#define PER 16u    // elements per lane

uint line, part;  // this quad's row or column, and this lane's place in it

uint element(uint m) { return part + 4u * m; }

// The sum over the quad's four lanes, the same bits in each.
float quad_sum(float x) {
    x += subgroupQuadSwapHorizontal(x);
    return x + subgroupQuadSwapVertical(x);
}

// Element [i][j] of a MAX_S x MAX_S shared array, j rotated by i: a row's and a column's
// neighbouring elements fall in different banks.
uint terms_at(uint i, uint j) { return i * MAX_S + ((i + j) % MAX_S); }
