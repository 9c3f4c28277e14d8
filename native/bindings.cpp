// The pybind11 module rlkit._native: tensors, the op table, graphs, threads, BLAS, RNG and the
// fused optimizer updates. Everything user-facing is wrapped by the Python package.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "backend.hpp"
#include "blas.hpp"
#include "elementwise_chain.hpp"
#include "host_cache.hpp"
#include "ops.hpp"
#include "program.hpp"
#include "random.hpp"
#include "skinny_product.hpp"
#include "strided_product.hpp"
#include "thread_pool.hpp"

namespace py = pybind11;
using namespace rk;

namespace {

py::dtype numpy_dtype(DType d) {
    switch (d) {
        case DType::f32: return py::dtype::of<float>();
        case DType::f16: return py::dtype("float16");
        case DType::i32: return py::dtype::of<int32_t>();
        case DType::f64: return py::dtype::of<double>();
        case DType::u8: return py::dtype::of<uint8_t>();
        case DType::bf16: return py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
    }
    throw std::logic_error("unknown dtype");
}

// Wraps a Fortran-ordered numpy array. Without `copy`, the tensor shares the array's memory
// and keeps the array alive.
TensorPtr from_numpy(py::array arr, const std::string& dtype_name_, bool copy, const std::string& device_name_) {
    const DType dtype = dtype_from_name(dtype_name_);
    if (!arr.dtype().is(numpy_dtype(dtype)))
        throw TypeError("from_numpy: array dtype " + std::string(py::str(arr.dtype())) + " does not match " + dtype_name_);
    if (!(arr.flags() & py::array::f_style))
        throw std::invalid_argument("from_numpy: the array must be Fortran-ordered (column-major)");
    if (arr.ndim() > kMaxDims)
        throw std::invalid_argument("rlkit tensors have at most 4 dimensions, got an array of " +
                                    std::to_string(arr.ndim()));
    Shape ne{1, 1, 1, 1};
    for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
        ne[d] = arr.shape(d);
        if (ne[d] == 0)
            throw std::invalid_argument("rlkit tensors need at least one element in every dimension, got shape " +
                                        std::string(py::str(py::tuple(py::cast(std::vector<py::ssize_t>(
                                            arr.shape(), arr.shape() + arr.ndim()))))));
    }
    const int ndim = std::max<int>(2, int(arr.ndim()));
    if (device_name_ == "gpu") {  // a device copy: uploaded through staging memory
        TensorPtr t = make_on(Device::gpu, ne, ndim, dtype);
        backend(Device::gpu).upload(*t, 0, arr.data(), t->nbytes());
        return t;
    }
    if (device_name_ != "cpu") throw std::invalid_argument("unknown device '" + device_name_ + "'");
    if (copy) {
        TensorPtr t = make_tensor(ne, ndim, dtype);
        std::memcpy(t->data(), arr.data(), t->nbytes());
        return t;
    }
    TensorPtr t = make_pending(ne, ndim, dtype);
    auto storage = std::make_shared<Storage>();
    storage->data = const_cast<void*>(arr.data());
    storage->nbytes = t->nbytes();
    auto* owner = new py::object(arr);
    storage->keep_alive = std::shared_ptr<void>(owner, [](void* p) {
        py::gil_scoped_acquire gil;
        delete static_cast<py::object*>(p);
    });
    t->storage = storage;
    return t;
}

// An uninitialised Fortran-ordered array shaped and typed like t.
py::array fortran_array_like(const TensorImpl& t) {
    std::vector<py::ssize_t> shape(t.ne.begin(), t.ne.begin() + t.ndim), strides(t.ndim);
    py::ssize_t stride = py::ssize_t(dtype_size(t.dtype));
    for (int d = 0; d < t.ndim; ++d) {
        strides[d] = stride;
        stride *= t.ne[d];
    }
    return py::array(numpy_dtype(t.dtype), shape, strides);
}

py::array to_numpy(const TensorImpl& t) {
    // Checked before any Python object exists in this frame.
    if (t.pending()) throw std::runtime_error("tensor " + t.shape_str() + " is pending: the graph that computes it has not run");
    py::array arr = fortran_array_like(t);
    backend(t.device).download(t, 0, arr.mutable_data(), t.nbytes());
    return arr;
}

// Overwrites a tensor's values in place (same shape and dtype); bumps its version.
void write_values(TensorImpl& t, py::array arr) {
    TensorPtr src = from_numpy(arr, dtype_name(t.dtype), false, "cpu");
    if (src->numel() != t.numel())
        throw std::invalid_argument("write: " + std::to_string(src->numel()) + " values for a tensor " + t.shape_str());
    backend(t.device).upload(t, 0, src->data(), t.nbytes());
    t.note_write();
}

// Columns [col0, col0 + k) of a 2-D tensor (a device buffer) as one contiguous byte range.
std::pair<size_t, size_t> column_bytes(const TensorImpl& t, int64_t col0, int64_t k, const char* what) {
    if (t.ndim != 2) throw std::invalid_argument(std::string(what) + ": the tensor must be 2-D, got " + t.shape_str());
    if (col0 < 0) throw std::invalid_argument(std::string(what) + ": negative column offset " + std::to_string(col0));
    if (k < 1 || col0 + k > t.ne[1])
        throw std::out_of_range(std::string(what) + ": columns [" + std::to_string(col0) + ", " + std::to_string(col0 + k) +
                                ") are past the end of " + std::to_string(t.ne[1]) + " columns");
    const size_t column = size_t(t.ne[0]) * dtype_size(t.dtype);
    return {size_t(col0) * column, size_t(k) * column};
}

// Writes a Fortran-ordered [rows, k] array into columns col0.. of t: only those bytes move.
void write_columns(TensorImpl& t, py::array arr, int64_t col0) {
    TensorPtr src = from_numpy(arr, dtype_name(t.dtype), false, "cpu");
    if (src->ne[0] != t.ne[0] || src->ndim != 2)
        throw std::invalid_argument("write_columns: data has shape " + src->shape_str() + ", expected [" +
                                    std::to_string(t.ne[0]) + ", k] columns");
    const auto [offset, n] = column_bytes(t, col0, src->ne[1], "write_columns");
    backend(t.device).upload(t, offset, src->data(), n);
    t.note_write();
}

py::array read_columns(const TensorImpl& t, int64_t col0, int64_t k) {
    const auto [offset, n] = column_bytes(t, col0, k, "read_columns");
    py::array arr(numpy_dtype(t.dtype), std::vector<py::ssize_t>{py::ssize_t(t.ne[0]), py::ssize_t(k)},
                  std::vector<py::ssize_t>{py::ssize_t(dtype_size(t.dtype)), py::ssize_t(t.ne[0] * dtype_size(t.dtype))});
    backend(t.device).download(t, offset, arr.mutable_data(), n);
    return arr;
}

py::dict stats_dict(const GraphStats& s) {
    py::dict d;
    d["n_nodes"] = s.n_nodes;
    d["arena_bytes"] = s.arena_bytes;
    d["intermediate_bytes"] = s.intermediate_bytes;
    d["kept_bytes"] = s.kept_bytes;
    d["n_skipped"] = s.n_skipped;
    d["n_views"] = s.n_views;
    return d;
}

// A program's input arrays as host pointers, each checked against its input's dtype, order and
// shape (the arrays themselves stay alive while the pointers are read: the caller holds them). No
// tensor is made of them: a replay of a small program, such as a policy's forward at every
// environment step, would spend more on making and freeing those than on its own work.
std::vector<const void*> program_inputs(const Program& p, const std::vector<py::array>& arrays) {
    const Inputs& inputs = p.inputs();
    std::vector<const void*> in_ptrs;
    for (size_t i = 0; i < arrays.size() && i < inputs.size(); ++i) {
        const py::array& arr = arrays[i];
        const TensorImpl& input = *inputs[i];
        const auto which = [i] { return "replay: input " + std::to_string(i); };  // for a refusal only
        if (!arr.dtype().is(numpy_dtype(input.dtype)))
            throw TypeError(which() + " has dtype " + std::string(py::str(arr.dtype())) + ", the capture expects " +
                            dtype_name(input.dtype));
        if (!(arr.flags() & py::array::f_style))
            throw std::invalid_argument(which() + " must be Fortran-ordered (column-major)");
        Shape ne{1, 1, 1, 1};
        bool fits = arr.ndim() <= kMaxDims;
        for (py::ssize_t d = 0; fits && d < arr.ndim(); ++d) ne[d] = arr.shape(d);
        if (!fits || ne != input.ne)
            throw std::invalid_argument(which() + " has shape " + std::string(py::str(arr.attr("shape"))) +
                                        ", the capture expects " + input.shape_str());
        in_ptrs.push_back(arr.data());
    }
    return in_ptrs;
}

// Fresh Fortran-ordered arrays for a program's first `count` outputs (the list returned) and
// their pointers.
std::pair<py::list, std::vector<void*>> program_outputs(const Program& p, size_t count) {
    py::list results;
    std::vector<void*> out_ptrs;
    for (size_t i = 0; i < count; ++i) {
        py::array a = fortran_array_like(*p.outputs()[i]);
        out_ptrs.push_back(a.mutable_data());
        results.append(a);
    }
    return {results, out_ptrs};
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "rlkit's native engine: tensors, the op table and the CPU backend";

    py::register_exception<rk::TypeError>(m, "NativeTypeError", PyExc_TypeError);
    py::register_exception<rk::OutOfMemory>(m, "NativeOutOfMemory", PyExc_MemoryError);

    py::class_<TensorImpl, TensorPtr>(m, "Tensor")
        .def_property_readonly("shape", [](const TensorImpl& t) {
            return py::tuple(py::cast(std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.ndim)));
        })
        .def_property_readonly("ndim", [](const TensorImpl& t) { return t.ndim; })
        .def_property_readonly("dtype", [](const TensorImpl& t) { return dtype_name(t.dtype); })
        .def_property_readonly("device", [](const TensorImpl& t) { return device_name(t.device); })
        .def_property_readonly("numel", &TensorImpl::numel)
        .def_property_readonly("nbytes", &TensorImpl::nbytes)
        .def_property_readonly("pending", &TensorImpl::pending)
        .def_property_readonly("version", [](const TensorImpl& t) { return t.version; })
        .def_property_readonly("data_ptr", [](const TensorImpl& t) {
            return t.device == Device::gpu ? uintptr_t(t.address()) : reinterpret_cast<uintptr_t>(t.data());
        })
        .def("numpy", &to_numpy, "A Fortran-ordered copy of the values.")
        .def("write", &write_values, "Overwrites the values in place from an array of the same size and dtype.")
        .def("write_columns", &write_columns, py::arg("array"), py::arg("col0"),
             "Writes a [rows, k] array into columns col0 .. col0 + k - 1 (only those bytes move).")
        .def("read_columns", &read_columns, py::arg("col0"), py::arg("k"), "A copy of k columns from col0.");

    m.def("from_numpy", &from_numpy, py::arg("array"), py::arg("dtype"), py::arg("copy"), py::arg("device") = "cpu");
    m.def("inline_constant", [](py::array arr, const std::string& dtype, const std::string& device) {
        if (device != "cpu" && device != "gpu") throw std::invalid_argument("unknown device '" + device + "'");
        const Device d = device == "gpu" ? Device::gpu : Device::cpu;
        const TensorPtr host = from_numpy(arr, dtype, false, "cpu");
        TensorPtr t = make_on(d, host->ne, host->ndim, host->dtype);
        backend(d).write_inline(*t, host->data(), host->nbytes());
        return t;
    }, py::arg("array"), py::arg("dtype"), py::arg("device"),
       "A small tensor of host values (a Fortran-ordered array of 4-byte multiples) written with the recorded "
       "work, not uploaded: on the GPU inside the command buffer, not counted as a transfer.");
    m.def("op_names", [] {
        std::vector<std::string> names;
        for (int i = 0; i < int(Op::count); ++i) names.push_back(op_info(Op(i)).name);
        return names;
    });
    m.def("op_id", [](const std::string& name) { return int(op_from_name(name)); });
    m.def("op_arity", [](int op) { return op_info(Op(op)).n_inputs; });
    m.def("elementwise_ops", [] {
        static const char* const kinds[] = {"unary", "binary", "backward"};
        py::list entries;
        for (const ElementwiseOp& e : elementwise_ops())
            entries.append(py::make_tuple(op_info(e.op).name, kinds[int(e.kind)], e.code, e.n_floats));
        return entries;
    }, "The elementwise ops (native/elementwise.def): (name, kind, code, number of float attributes) each.");
    m.def("op_differentiable", [](int op) { return op_info(Op(op)).differentiable; },
          "Whether an op id is marked `grad` in ops.def (recorded on the tape, with a vjp rule).");
    m.def(
        "apply",
        [](int op, const std::vector<TensorPtr>& inputs, std::vector<int64_t> ints, std::vector<double> floats,
           const std::string& device) {
            if (op < 0 || op >= int(Op::count)) throw std::invalid_argument("apply: unknown op id " + std::to_string(op));
            const Device d = device == "gpu" ? Device::gpu : Device::cpu;
            return apply(Op(op), inputs, OpAttrs{std::move(ints), std::move(floats)}, d);
        },
        py::arg("op"), py::arg("inputs"), py::arg("ints") = std::vector<int64_t>{},
        py::arg("floats") = std::vector<double>{}, py::arg("device") = "cpu");

    m.def(
        "check_inputs",
        [](int op, const std::vector<TensorPtr>& inputs, std::vector<int64_t> ints, std::vector<double> floats) {
            if (op < 0 || op >= int(Op::count)) throw std::invalid_argument("check_inputs: unknown op id " + std::to_string(op));
            Device device = Device::cpu;
            check_inputs(Op(op), inputs, OpAttrs{std::move(ints), std::move(floats)}, device);
        },
        py::arg("op"), py::arg("inputs"), py::arg("ints") = std::vector<int64_t>{},
        py::arg("floats") = std::vector<double>{},
        "Raises what apply would raise for these inputs, without running the op (a composed form "
        "of an op checks its arguments as the op does).");

    py::class_<Graph>(m, "Graph")
        .def(py::init<>())
        .def("__enter__", [](Graph& g) {
            if (recording_graph()) throw std::runtime_error("a graph is already recording on this thread");
            set_recording_graph(&g);
            return &g;
        }, py::return_value_policy::reference)
        .def("__exit__", [](Graph&, py::object, py::object, py::object) {
            set_recording_graph(nullptr);
            return false;
        })
        .def("__len__", &Graph::size)
        .def("run", [](Graph& g) { return stats_dict(g.run()); },
             "Plans memory by liveness and executes every recorded node; returns planner statistics.");
    m.def("is_recording", [] { return recording_graph() != nullptr; });

    m.def("placeholder", [](std::vector<int64_t> shape, const std::string& dtype, const std::string& device) {
        if (shape.empty() || shape.size() > size_t(kMaxDims)) throw std::invalid_argument("placeholder: 1 to 4 sizes");
        Shape ne{1, 1, 1, 1};
        for (size_t d = 0; d < shape.size(); ++d) ne[d] = shape[d];
        return make_pending(ne, std::max<int>(2, int(shape.size())), dtype_from_name(dtype),
                            device == "gpu" ? Device::gpu : Device::cpu);
    }, "A pending tensor a Program fills at every replay (a captured function's input).");

    py::class_<Program>(m, "Program")
        .def(py::init([](Graph& g, const Inputs& inputs, const Inputs& outputs, size_t n_early) {
            return new Program(g.take_nodes(), inputs, outputs, n_early);
        }), py::arg("graph"), py::arg("inputs"), py::arg("outputs"), py::arg("n_early") = 0)
        .def("replay", [](Program& p, const std::vector<py::array>& arrays) {
            std::vector<const void*> in_ptrs = program_inputs(p, arrays);
            auto [results, out_ptrs] = program_outputs(p, p.outputs().size());
            p.replay(in_ptrs, out_ptrs);
            return results;
        }, py::arg("arrays"),
           "Replays with the given input arrays; returns the outputs as Fortran-ordered arrays.")
        .def("launch", [](Program& p, const std::vector<py::array>& arrays) {
            p.launch(program_inputs(p, arrays));  // copied into the program's input block before launch returns
        }, py::arg("arrays"),
           "Starts a replay with the given input arrays: on the GPU it returns while the program runs "
           "(work submitted later runs after it); finish() returns its outputs.")
        .def("finish", [](Program& p) {
            auto [results, out_ptrs] = program_outputs(p, p.outputs().size());
            p.finish(out_ptrs);
            return results;
        }, "Waits for the launched replay; returns its outputs as Fortran-ordered arrays.")
        .def("early", [](Program& p) {
            auto [results, out_ptrs] = program_outputs(p, p.n_early());
            p.early(out_ptrs);
            return results;
        }, "Between launch and finish: the first n_early outputs, as soon as the launched replay has "
           "computed them (on the GPU, while the rest of it runs).")
        .def_property_readonly("n_nodes", &Program::n_nodes)
        .def_property_readonly("n_live", &Program::n_live)
        .def_property_readonly("n_views", &Program::n_views,
                               "Live nodes that read their input's bytes in place rather than copy them (native/views.hpp).")
        .def_property_readonly("arena_bytes", &Program::arena_bytes)
        .def("level_times", [](const Program& p) {
            py::list levels;
            for (const LevelTime& t : p.level_times()) levels.append(py::make_tuple(t.mean_us, t.label));
            return levels;
        }, "[(mean microseconds, what runs)] per dependency level (GPU, recorded with set_gpu_profiling on) "
           "or per node (CPU, created with set_cpu_profiling on), once it has run; else [].");

    m.def("build_info", [] {
        py::dict d;
#ifdef RLKIT_VULKAN
        d["vulkan"] = true;
        d["shader_compilers"] = RLKIT_SHADER_COMPILERS;
#else
        d["vulkan"] = false;
        d["shader_compilers"] = "";
#endif
        d["vulkan_option"] = RLKIT_VULKAN_OPTION;
        return d;
    }, "How this module was built: whether the Vulkan backend is compiled in, the RLKIT_VULKAN "
       "switch it was configured with (AUTO, ON or OFF), and the shader compilers it used (CMakeLists.txt; "
       "empty without the backend).");
    m.def("gpu_unavailable_reason", &gpu_unavailable_reason,
          "Why the GPU backend cannot be used here (empty when it can); creates the Vulkan context on first use.");
    m.def("gpu_info", []() -> py::object {
        GpuInfo info;
        if (!gpu_info(&info)) return py::none();
        py::dict d;
        d["name"] = info.name;
        d["memory"] = info.memory;
        d["subgroup_size"] = info.subgroup_size;
        d["max_shared_memory"] = info.max_shared_memory;
        d["memory_in_use"] = info.memory_in_use;
        d["memory_reserved"] = info.memory_reserved;
        d["validation"] = info.validation;
        d["subgroup_quad"] = info.subgroup_quad;
        d["pipeline_statistics"] = info.pipeline_statistics;
        return d;
    });
    m.def(
        "gpu_matmul_kernel",
        [](const std::string& dtype, int64_t m, int64_t n, int64_t batch, std::optional<int64_t> k) -> py::object {
            const DType d = dtype_from_name(dtype);
            if (d != DType::f32 && !is_half(d))
                throw TypeError("gpu_matmul_kernel: dtype must be 'f32', 'f16' or 'bf16', got '" + dtype + "'");
            if (m < 1 || n < 1 || batch < 1 || (k && *k < 1))
                throw std::invalid_argument("gpu_matmul_kernel: m, n, batch and k must be >= 1");
            const std::string kernel = gpu_matmul_kernel(d, m, n, k.value_or(m), batch);
            if (kernel.empty()) return py::none();
            return py::str(kernel);
        },
        py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("batch") = 1, py::arg("k") = py::none(),
        "The kernel GPU matmul uses for this dtype and an [m, n] output with `batch` slices over a reduction "
        "of k (None: m, a square product), in words; None without a GPU.");
    m.def(
        "gpu_conv2d_kernel",
        [](const std::string& dtype) -> py::object {
            const DType d = dtype_from_name(dtype);
            if (d != DType::f32 && !is_half(d))
                throw TypeError("gpu_conv2d_kernel: dtype must be 'f32', 'f16' or 'bf16', got '" + dtype + "'");
            const std::string kernel = gpu_conv2d_kernel(d);
            if (kernel.empty()) return py::none();
            return py::str(kernel);
        },
        py::arg("dtype"), "The kernel GPU conv2d uses for operands of this dtype, in words; None without a GPU.");
    m.def(
        "gpu_scan_kernel",
        [](bool backward, int64_t d_state, int64_t head_dim, int64_t n_tok, bool mamba1) -> py::object {
            if (d_state < 1 || head_dim < 1 || n_tok < 1)
                throw std::invalid_argument("gpu_scan_kernel: d_state, head_dim and n_tok must be >= 1");
            const std::string kernel = gpu_scan_kernel(backward, d_state, head_dim, n_tok, mamba1);
            if (kernel.empty()) return py::none();
            return py::str(kernel);
        },
        py::arg("backward"), py::arg("d_state"), py::arg("head_dim"), py::arg("n_tok"), py::arg("mamba1") = false,
        "The shader GPU ssm_scan (backward: its backward helper) runs at these sizes; None without a GPU.");
    m.def("gpu_counters", [](bool reset) {
        py::dict d;
        for (const auto& [k, v] : gpu_counters(reset)) d[k.c_str()] = v;
        return d;
    }, py::arg("reset") = false);
    m.def("gpu_pipeline_statistics", [] {
        py::dict d;
        for (const auto& [shader, statistics] : gpu_pipeline_statistics()) {
            py::dict named;
            for (const auto& [name, value] : statistics) named[name.c_str()] = value;
            d[shader.c_str()] = named;
        }
        return d;
    }, "{shader: {statistic: value}}: what the driver's compiler reports of each GPU pipeline made so far "
       "(registers, spills, shared memory), where RLKIT_VK_PIPELINE_STATISTICS=1 was set before the GPU's "
       "first use and the driver offers VK_KHR_pipeline_executable_properties; else {}.");
    m.def("set_gpu_poison", &set_gpu_poison, py::arg("on"));
    m.def("set_gpu_profiling", &set_gpu_profiling, py::arg("on"),
          "Programs recorded from now on time each dependency level; False where the GPU cannot time.");
    m.def("set_gpu_submit_after", [](int64_t microseconds) {
        if (microseconds < 0)
            throw std::invalid_argument("set_gpu_submit_after: microseconds must be >= 0, got " + std::to_string(microseconds));
        return set_gpu_submit_after(microseconds);
    }, py::arg("microseconds"),
          "An eager GPU recording the host has spent this many microseconds on is submitted at its next "
          "command (0: only when read, synchronized or 4096 commands long); returns the previous value.");
    m.def("host_writes", &host_writes,
          "In-place writes to any tensor so far: while it is unchanged, no tensor's version changed.");
    m.def("set_cpu_profiling", &set_cpu_profiling, py::arg("on"),
          "CPU programs created from now on time each node at every replay (Program.level_times).");
    m.def("relocate", [](TensorImpl& t) {
        if (t.pending()) throw std::runtime_error("relocate: the tensor is pending");
        TensorPtr fresh = make_on(t.device, t.ne, t.ndim, t.dtype);
        std::vector<char> bytes(t.nbytes());
        backend(t.device).download(t, 0, bytes.data(), bytes.size());
        backend(t.device).upload(*fresh, 0, bytes.data(), bytes.size());
        t.storage = fresh->storage;
        t.offset = fresh->offset;
    }, py::arg("tensor"), "Tests: moves a tensor's values to fresh storage, as a reallocation would "
       "(a recorded program reading it must re-record).");
    m.def("provoke_validation_error", &provoke_validation_error,
          "Tests: the validation errors one deliberately invalid Vulkan call draws (-1: the layer is off).");
    m.def("host_cache_stats", [] {
        const HostCacheStats s = host_cache_stats();
        py::dict d;
        d["budget_bytes"] = s.budget_bytes;
        d["kept_bytes"] = s.kept_bytes;
        d["kept_blocks"] = s.kept_blocks;
        d["reused_blocks"] = s.reused_blocks;
        return d;
    }, "Freed host blocks of at least 1 MiB kept for the next tensor of their size (native/host_cache.hpp).");
    m.def("host_cache_clear", &host_cache_clear, "Frees every kept host block.");
    m.def("set_host_poison", &set_host_poison, py::arg("on"),
          "Tests: new host tensor memory filled with 0xff bytes (NaN), so unwritten outputs show.");
    m.def("submit", [](const std::string& device) {
        backend(device == "gpu" ? Device::gpu : Device::cpu).submit();
    }, py::arg("device"), "Starts the recorded GPU work without waiting for it.");
    m.def("synchronize", [](const std::string& device) {
        backend(device == "gpu" ? Device::gpu : Device::cpu).synchronize();
    }, py::arg("device"));
    m.def("set_num_threads", &set_num_threads);
    m.def("num_threads", &num_threads);
    m.def("set_strided_products", &set_strided_products, py::arg("on"),
          "Tests: the CPU convolution's AVX-512 products on (where the CPU has them) or off (the BLAS); "
          "returns the previous setting.");
    m.def("cpu_product_kernels", [] {
        py::dict kernels;
        kernels["strided"] = strided_products_available();
        kernels["skinny"] = skinny_products_available();
        return kernels;
    }, "Which of the CPU's own product kernels run here: {'strided': AVX-512 (small products), "
       "'skinny': AVX2 + FMA (a side of at most 32 or a depth of at most 8)}.");
    m.def("set_skinny_products", &set_skinny_products, py::arg("on"),
          "Tests and benchmarks: the AVX2 + FMA products of a C with at most 32 rows or columns, or a depth of at "
          "most 8, on (where the CPU has them) or off (the BLAS); returns the previous setting.");
    m.def("set_wide_elementwise", &set_wide_elementwise, py::arg("on"),
          "Tests: the AVX2 + FMA loops of exp, sigmoid and silu on floats on (where the CPU has them) or off "
          "(the baseline's); returns the previous setting.");
    m.def("nested_parallel_count", [](int64_t outer, int64_t inner) {
        std::vector<int64_t> counts(size_t(std::max<int64_t>(outer, 0)), 0);
        py::gil_scoped_release release;
        parallel_for(outer, 1, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i)
                parallel_for(inner, 1, [&](int64_t a, int64_t b) { counts[size_t(i)] += b - a; });
        });
        return counts;
    }, py::arg("outer"), py::arg("inner"),
       "Tests: a parallel_for over `outer` items whose every item runs a parallel_for over `inner` "
       "(inline, on the thread running the item); the items each inner loop counted.");
    m.def("load_blas", &load_blas, py::arg("path"));
    m.def("blas_name", &blas_name);
    m.def("manual_seed", &manual_seed, py::arg("seed"));
    m.def("rng_state", [] {
        RngState s = rng_state();
        return py::make_tuple(s.seed, s.counter);
    });
    m.def("set_rng_state", [](uint64_t seed, uint64_t counter) { set_rng_state(RngState{seed, counter}); });
}
