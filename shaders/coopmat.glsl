// The cooperative-matrix fragments of rlkit's tensor-core kernels (matmul_coopmat.comp,
// conv2d_coopmat.comp), 16 x 16 at subgroup scope: A and B of ELEMENT
// (f16 or bf16, defined by the includer), f32 sums. VK_KHR_cooperative_matrix where the build's
// shader compiler knows it (KHR_COOPMAT; its fragments declare their use, A, B or accumulator),
// else VK_NV_cooperative_matrix (f16 only). The includer declares the extensions.
#if defined(KHR_COOPMAT)
#define FRAGMENT_A coopmat<ELEMENT, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAGMENT_B coopmat<ELEMENT, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAGMENT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define COLUMN_MAJOR gl_CooperativeMatrixLayoutColumnMajor
#define ROW_MAJOR gl_CooperativeMatrixLayoutRowMajor
#define LOAD_FRAGMENT coopMatLoad
#define STORE_FRAGMENT coopMatStore
#define MUL_ADD coopMatMulAdd
#else
#define FRAGMENT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAGMENT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAGMENT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define COLUMN_MAJOR true
#define ROW_MAJOR false
#define LOAD_FRAGMENT coopMatLoadNV
#define STORE_FRAGMENT coopMatStoreNV
#define MUL_ADD coopMatMulAddNV
#endif
