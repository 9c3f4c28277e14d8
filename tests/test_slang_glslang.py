"""shaders/slang_glslang.py, the build's glslangValidator over PyPI slangpy's glslang: its own
preprocessing (includes, defines) checked line by line, and, where slangpy is installed (CI installs
it), real compiles checked with the library's own SPIR-V validator and disassembler."""

import ctypes
import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "shaders", "slang_glslang.py")
SHADERS = os.path.dirname(SCRIPT)


def load_front_end():
    spec = importlib.util.spec_from_file_location("slang_glslang", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


front_end = load_front_end()


def library_or_skip() -> str:
    try:
        return front_end.find_library()
    except front_end.ShaderError as error:
        pytest.skip(f"no Slang glslang here: {error}")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_includes_expand_in_place_with_line_directives_naming_each_file(tmp_path):
    """An include is looked for in the including file's folder, then in each -I folder; each
    expansion is framed by #line directives, so glslang's messages name the right file and line."""
    shared = tmp_path / "shared"
    shared.mkdir()
    inner = write(shared / "inner.glsl", "float inner() { return 2.0; }")
    outer = write(tmp_path / "outer.glsl", '#include "inner.glsl"\nfloat outer() { return inner(); }')
    main = write(tmp_path / "main.comp", '#version 450\n#include "outer.glsl"\nvoid main() {}')
    lines = front_end.expand_includes(main, [str(shared)])
    assert lines == ["#version 450",
                     f'#line 1 "{outer}"',
                     f'#line 1 "{inner}"', "float inner() { return 2.0; }", f'#line 2 "{outer}"',
                     "float outer() { return inner(); }",
                     f'#line 3 "{main}"',
                     "void main() {}"]


def test_defines_follow_the_version_line_and_the_lines_keep_their_numbers(tmp_path):
    main = write(tmp_path / "main.comp", "// a comment\n#version 450\nvoid main() {}")
    source = front_end.preprocessed_source(main, [], [("BF16", ""), ("TILE", "64")])
    assert source.splitlines() == ["// a comment", "#version 450", "#define BF16 ", "#define TILE 64",
                                   f'#line 3 "{main}"', "void main() {}"]


def test_a_missing_include_and_an_include_cycle_are_refused_by_name(tmp_path):
    main = write(tmp_path / "main.comp", '#version 450\n#include "nowhere.glsl"\n')
    with pytest.raises(front_end.ShaderError, match=r'main.comp:2: #include "nowhere.glsl" is in none of'):
        front_end.expand_includes(main, [])
    looping = write(tmp_path / "loop.glsl", '#include "loop.glsl"\n')
    with pytest.raises(front_end.ShaderError, match="nested more than 32 deep"):
        front_end.expand_includes(looping, [])


def test_the_command_line_refuses_what_it_does_not_take():
    for argv, message in ((["-V", "--target-env", "vulkan9", "-o", "x.spv", "a.comp"], "--target-env 'vulkan9'"),
                          (["-V", "--glsl-version", "450", "-o", "x.spv", "a.comp"], "unknown option '--glsl-version'"),
                          (["-V", "-o", "x.spv", "a.comp", "b.comp"], "a second source 'b.comp'"),
                          (["-V", "a.comp"], "usage:")):
        result = run(*argv)
        assert result.returncode == 1 and message in result.stderr, (argv, result.stderr)


def test_a_library_named_by_the_environment_must_exist(monkeypatch):
    monkeypatch.setenv(front_end.LIBRARY_ENV, "/nowhere/libslang-glslang.so")
    with pytest.raises(front_end.ShaderError, match="is not a file"):
        front_end.find_library()


def spirv_words(path: str) -> tuple[ctypes.Array, int]:
    data = open(path, "rb").read()
    assert len(data) % 4 == 0
    return (ctypes.c_uint32 * (len(data) // 4)).from_buffer_copy(data), len(data) // 4


def disassembly(library: str, path: str) -> str:
    """The SPIR-V's text from the library's disassembler, after its validator passed it."""
    lib = ctypes.CDLL(library)
    words, count = spirv_words(path)
    lib.glslang_validateSPIRV.restype = ctypes.c_bool
    assert lib.glslang_validateSPIRV(words, count), f"{path}: SPIR-V the validator refuses"
    text = ctypes.c_char_p()
    lib.glslang_disassembleSPIRVWithResult.restype = ctypes.c_bool
    assert lib.glslang_disassembleSPIRVWithResult(words, count, ctypes.byref(text))
    return text.value.decode()


@pytest.mark.parametrize("defines, capabilities", [
    ([], ["CooperativeMatrixKHR", "Float16"]),
    (["-DBF16", "-DTRANSPOSE_A", "-DCHUNKED"], ["CooperativeMatrixKHR", "BFloat16TypeKHR",
                                                "BFloat16CooperativeMatrixKHR"]),
])
def test_the_cooperative_matrix_matmul_compiles_to_valid_spirv_with_its_capabilities(tmp_path, defines, capabilities):
    """The build's own command for matmul_coopmat.comp (CMakeLists.txt's rk_shader with
    KHR_COOPMAT): SPIR-V 1.5 that the validator passes, declaring KHR cooperative matrices (and,
    for the BF16 variant, bf16 ones), which Debian's glslc cannot write."""
    library = library_or_skip()
    out = str(tmp_path / "matmul.spv")
    result = run("-V", "--target-env", "vulkan1.2", f"-I{SHADERS}", *defines, "-DKHR_COOPMAT", "-o", out,
                 os.path.join(SHADERS, "matmul_coopmat.comp"))
    assert result.returncode == 0, result.stderr
    words, _ = spirv_words(out)
    assert words[0] == front_end.SPIRV_MAGIC and words[1] == 0x00010500  # SPIR-V 1.5: Vulkan 1.2
    text = disassembly(library, out)
    for capability in capabilities:
        assert f"OpCapability {capability}\n" in text
    assert ("OpCapability CooperativeMatrixNV" not in text) and ("BFloat16" in text) == ("-DBF16" in defines)


def test_a_shader_error_names_the_included_file_and_its_line(tmp_path):
    library_or_skip()
    write(tmp_path / "broken.glsl", "float ok() { return 1.0; }\nfloat broken() { return undefined_name; }\n")
    main = write(tmp_path / "main.comp", '#version 450\n#include "broken.glsl"\nlayout(local_size_x = 1) in;\n'
                                         "void main() {}\n")
    out = tmp_path / "main.spv"
    result = run("-V", "--target-env", "vulkan1.2", "-o", str(out), main)
    assert result.returncode == 1 and "broken.glsl:2" in result.stderr and "undefined_name" in result.stderr
    assert not out.exists() and not (tmp_path / "main.spv.partial").exists()


def test_a_define_selects_the_code_glslang_compiles(tmp_path):
    """-D reaches the shader: the same source compiles with the macro and fails without it."""
    library_or_skip()
    main = write(tmp_path / "main.comp", "#version 450\nlayout(local_size_x = TILE) in;\nvoid main() {}\n")
    assert run("-V", "--target-env", "vulkan1.2", "-DTILE=64", "-o", str(tmp_path / "a.spv"), main).returncode == 0
    assert run("-V", "--target-env", "vulkan1.2", "-o", str(tmp_path / "b.spv"), main).returncode == 1


COOPMAT2_PRODUCT = """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 128) in;
layout(binding = 0) buffer A { float16_t a[]; };
layout(binding = 1) buffer C { float c[]; };
void main() {
    tensorLayoutNV<2> layout_a = setTensorLayoutDimensionNV(createTensorLayoutNV(2), 64, 64);
    tensorLayoutNV<2> layout_c = setTensorLayoutDimensionNV(createTensorLayoutNV(2), 64, 64);
    coopmat<float16_t, gl_ScopeWorkgroup, 64, 16, gl_MatrixUseA> x;
    coopmat<float16_t, gl_ScopeWorkgroup, 16, 64, gl_MatrixUseB> y;
    coopmat<float, gl_ScopeWorkgroup, 64, 64, gl_MatrixUseAccumulator> sum =
        coopmat<float, gl_ScopeWorkgroup, 64, 64, gl_MatrixUseAccumulator>(0.0);
    coopMatLoadTensorNV(x, a, 0, sliceTensorLayoutNV(layout_a, 0, 64, 0, 16));
    coopMatLoadTensorNV(y, a, 0, sliceTensorLayoutNV(layout_a, 0, 16, 0, 64));
    sum = coopMatMulAdd(x, y, sum);
    coopMatStoreTensorNV(sum, c, 0, sliceTensorLayoutNV(layout_c, 0, 64, 0, 64));
}
"""


def test_it_knows_nv_cooperative_matrix_2(tmp_path):
    """A workgroup-scope product with tensor layouts (GL_NV_cooperative_matrix2, the extension
    llama.cpp's Vulkan matmul uses on NVIDIA; Debian's glslc 2023.2 refuses it) compiles for
    Vulkan 1.3 to SPIR-V 1.6 that the validator passes, with the tensor-addressing capabilities."""
    library = library_or_skip()
    out = str(tmp_path / "coopmat2.spv")
    result = run("-V", "--target-env", "vulkan1.3", "-o", out, write(tmp_path / "coopmat2.comp", COOPMAT2_PRODUCT))
    assert result.returncode == 0, result.stderr
    assert spirv_words(out)[0][1] == 0x00010600
    text = disassembly(library, out)
    for capability in ("CooperativeMatrixKHR", "CooperativeMatrixTensorAddressingNV", "TensorAddressingNV"):
        assert f"OpCapability {capability}\n" in text
    assert 'OpExtension "SPV_NV_cooperative_matrix2"' in text
