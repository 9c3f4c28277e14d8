"""A glslangValidator for the build, from a registry package: the glslang inside PyPI's ``slangpy``
wheel (``libslang-glslang-<version>.so``, Slang's build of glslang, 2026), which knows
GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2 and GL_EXT_bfloat16, where Debian's glslc
2023.2 and glslang 12/13 do not. The build runs it as it would run glslangValidator, with the
subset of its command line that CMakeLists.txt uses:

    python3 slang_glslang.py -V --target-env vulkan1.2 [-I<dir> ...] [-D<name>[=<value>] ...] -o <out.spv> <source>
    python3 slang_glslang.py --find      # prints the library's path, or exits 1 saying why

The library is ``$RLKIT_SLANG_GLSLANG`` where set (a path to the .so), else the one in the
installed ``slangpy`` package (found without importing it). Its entry point, ``glslang_compile_1_2``,
takes one source string and no include paths or macros, so this script expands ``#include "..."``
itself (the including file's folder first, then each -I, as glslang does), with ``#line``
directives naming each file for the diagnostics, and writes each -D as a ``#define`` after the
``#version`` line. Only the standard library is used: the build needs nothing else.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import sys

LIBRARY_ENV = "RLKIT_SLANG_GLSLANG"
STAGE_COMPUTE = 6  # SlangStage's SLANG_STAGE_COMPUTE
ACTION_COMPILE_GLSL_TO_SPIRV = 0
SPIRV_OF_TARGET_ENV = {"vulkan1.0": (1, 0), "vulkan1.1": (1, 3), "vulkan1.2": (1, 5), "vulkan1.3": (1, 6)}
SPIRV_MAGIC = 0x07230203
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
VERSION = re.compile(r"^\s*#\s*version\b")
MAX_INCLUDE_DEPTH = 32

OutputFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class SpirvVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int)]


class CompileRequest(ctypes.Structure):
    """Slang's glslang_CompileRequest_1_2 (source/slang-glslang/slang-glslang.h), field by field."""
    _fields_ = [("sizeInBytes", ctypes.c_size_t),
                ("sourcePath", ctypes.c_char_p),
                ("inputBegin", ctypes.c_void_p),
                ("inputEnd", ctypes.c_void_p),
                ("diagnosticFunc", OutputFunc),
                ("diagnosticUserData", ctypes.c_void_p),
                ("outputFunc", OutputFunc),
                ("outputUserData", ctypes.c_void_p),
                ("slangStage", ctypes.c_int),
                ("action", ctypes.c_uint),
                ("optimizationLevel", ctypes.c_uint),
                ("debugInfoType", ctypes.c_uint),
                ("spirvTargetName", ctypes.c_char_p),
                ("spirvVersion", SpirvVersion),
                ("entryPointName", ctypes.c_char_p)]


class ShaderError(Exception):
    """A shader that could not be compiled, or a library that could not be found or used."""


def find_library() -> str:
    """The path of Slang's glslang library: $RLKIT_SLANG_GLSLANG, else slangpy's own."""
    path = os.environ.get(LIBRARY_ENV)
    if path:
        if not os.path.isfile(path):
            raise ShaderError(f"{LIBRARY_ENV}={path!r} is not a file")
        return path
    spec = importlib.util.find_spec("slangpy")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ShaderError(f"neither {LIBRARY_ENV} nor the slangpy package (pip install slangpy) is here")
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "libslang-glslang-*.so")))
        if found:
            return found[-1]
    raise ShaderError(f"slangpy at {list(spec.submodule_search_locations)} has no libslang-glslang-*.so")


def expand_includes(path: str, include_dirs: list[str], depth: int = 0) -> list[str]:
    """The lines of ``path`` with each ``#include "name"`` replaced by that file's lines (found in
    ``path``'s folder, then in ``include_dirs``), a ``#line`` directive before and after each."""
    if depth > MAX_INCLUDE_DEPTH:
        raise ShaderError(f"{path}: includes nested more than {MAX_INCLUDE_DEPTH} deep (an include cycle?)")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        match = INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        name = match.group(1)
        candidates = [os.path.join(os.path.dirname(path), name)] + [os.path.join(d, name) for d in include_dirs]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            raise ShaderError(f"{path}:{number}: #include \"{name}\" is in none of {candidates}")
        out.append(f'#line 1 "{found}"')
        out += expand_includes(found, include_dirs, depth + 1)
        out.append(f'#line {number + 1} "{path}"')
    return out


def preprocessed_source(path: str, include_dirs: list[str], defines: list[tuple[str, str]]) -> str:
    """The source the library compiles: includes expanded, each define after ``#version``."""
    lines = expand_includes(path, include_dirs)
    at = next((i + 1 for i, line in enumerate(lines) if VERSION.match(line)), 0)
    macros = [f"#define {name} {value}" for name, value in defines]
    if macros:
        macros.append(f'#line {at + 1} "{path}"')
    return "\n".join(lines[:at] + macros + lines[at:]) + "\n"


def compile_glsl(library: str, source: str, source_path: str, spirv_version: tuple[int, int]) -> bytes:
    """The SPIR-V of a compute shader's GLSL ``source``, or ShaderError with glslang's diagnostics."""
    try:
        compile_1_2 = ctypes.CDLL(library).glslang_compile_1_2
    except (OSError, AttributeError) as error:
        raise ShaderError(f"{library}: not a usable Slang glslang library ({error})") from None
    compile_1_2.argtypes = [ctypes.POINTER(CompileRequest)]
    compile_1_2.restype = ctypes.c_int
    output, diagnostics = bytearray(), bytearray()
    on_output = OutputFunc(lambda data, size, _: output.extend(ctypes.string_at(data, size)))
    on_diagnostic = OutputFunc(lambda data, size, _: diagnostics.extend(ctypes.string_at(data, size)))
    text = ctypes.create_string_buffer(source.encode("utf-8"))
    begin = ctypes.addressof(text)
    request = CompileRequest(
        sizeInBytes=ctypes.sizeof(CompileRequest), sourcePath=source_path.encode("utf-8"),
        inputBegin=begin, inputEnd=begin + len(text.value), diagnosticFunc=on_diagnostic, outputFunc=on_output,
        slangStage=STAGE_COMPUTE, action=ACTION_COMPILE_GLSL_TO_SPIRV, optimizationLevel=0, debugInfoType=0,
        spirvVersion=SpirvVersion(*spirv_version, 0), entryPointName=b"main")
    status = compile_1_2(ctypes.byref(request))
    message = diagnostics.decode("utf-8", "replace").strip()
    if status != 0 or len(output) < 20 or int.from_bytes(output[:4], "little") != SPIRV_MAGIC:
        raise ShaderError(f"{source_path}: glslang failed (status {status}){': ' + message if message else ''}")
    return bytes(output)


def parse_command_line(argv: list[str]) -> dict:
    """glslangValidator's options that the build passes; anything else is refused by name."""
    options = {"include_dirs": [], "defines": [], "target_env": "vulkan1.0", "output": None, "source": None}
    args = iter(argv)
    for arg in args:
        if arg == "-V":
            continue
        if arg == "--target-env":
            options["target_env"] = next(args, None)
            if options["target_env"] not in SPIRV_OF_TARGET_ENV:
                raise ShaderError(f"--target-env {options['target_env']!r}: expected one of "
                                  f"{sorted(SPIRV_OF_TARGET_ENV)}")
        elif arg.startswith("-I"):
            options["include_dirs"].append(arg[2:] or next(args, ""))
        elif arg.startswith("-D") and len(arg) > 2:
            name, _, value = arg[2:].partition("=")
            options["defines"].append((name, value))
        elif arg == "-o":
            options["output"] = next(args, None)
        elif arg.startswith("-"):
            raise ShaderError(f"unknown option {arg!r} (this front end takes -V, --target-env, -I, -D and -o)")
        elif options["source"] is None:
            options["source"] = arg
        else:
            raise ShaderError(f"a second source {arg!r}: one shader per call")
    if options["source"] is None or options["output"] is None:
        raise ShaderError("usage: slang_glslang.py -V --target-env vulkan1.2 [-I<dir>] [-D<name>[=<value>]] "
                          "-o <out.spv> <source>")
    return options


def main(argv: list[str]) -> int:
    try:
        if argv == ["--find"]:
            print(find_library())
            return 0
        options = parse_command_line(argv)
        source = preprocessed_source(options["source"], options["include_dirs"], options["defines"])
        spirv = compile_glsl(find_library(), source, options["source"], SPIRV_OF_TARGET_ENV[options["target_env"]])
    except ShaderError as error:
        print(f"slang_glslang: {error}", file=sys.stderr)
        return 1
    partial = options["output"] + ".partial"  # a killed build leaves no truncated .spv behind
    with open(partial, "wb") as f:
        f.write(spirv)
    os.replace(partial, options["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
