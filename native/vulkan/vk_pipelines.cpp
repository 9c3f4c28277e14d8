// Shader pipelines: one per embedded variant, made at its first dispatch, all with one layout
// (push constants only: shaders address tensors by buffer device address).
#include <stdexcept>
#include <string>
#include <vector>

#include "vulkan/vk_context.hpp"
#include "vulkan/vk_shaders.hpp"

namespace rk::vk {

VkPipeline Context::pipeline(const std::string& shader) {
    auto it = pipelines_.find(shader);
    if (it != pipelines_.end()) return it->second;
    const ShaderCode* code = find_shader(shader);
    if (!code) throw std::logic_error("no embedded shader named " + shader);
    VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smci.codeSize = code->size;
    smci.pCode = code->words;
    VkShaderModule module;
    check(api_.vkCreateShaderModule(device_, &smci, nullptr, &module), "vkCreateShaderModule");
    VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
    cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    cpci.stage.module = module;
    cpci.stage.pName = "main";
    cpci.layout = layout_;
    if (get_statistics_) cpci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    VkPipeline p;
    VkResult r = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &cpci, nullptr, &p);
    api_.vkDestroyShaderModule(device_, module, nullptr);
    check(r, ("vkCreateComputePipelines(" + shader + ")").c_str());
    pipelines_[shader] = p;
    if (get_statistics_) keep_statistics(shader, p);
    return p;
}

namespace {

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
    switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return std::to_string(s.value.i64);
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return std::to_string(s.value.u64);
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return std::to_string(s.value.f64);
        default: return "?";
    }
}

// Vulkan's two-call enumeration: the count, then that many elements, each made from `blank`.
template <typename T, typename Call>
std::vector<T> enumerated(T blank, Call call, const char* what) {
    uint32_t n = 0;
    check(call(&n, nullptr), what);
    std::vector<T> all(n, blank);
    check(call(&n, all.data()), what);
    all.resize(n);
    return all;
}

}  // namespace

void Context::keep_statistics(const std::string& shader, VkPipeline pipeline) {
    VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
    info.pipeline = pipeline;
    const auto executables = enumerated(
        VkPipelineExecutablePropertiesKHR{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR},
        [&](uint32_t* n, VkPipelineExecutablePropertiesKHR* out) { return get_executables_(device_, &info, n, out); },
        "vkGetPipelineExecutablePropertiesKHR");
    auto& kept = pipeline_statistics_[shader];
    for (uint32_t e = 0; e < executables.size(); ++e) {
        VkPipelineExecutableInfoKHR which{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
        which.pipeline = pipeline;
        which.executableIndex = e;
        const auto statistics = enumerated(
            VkPipelineExecutableStatisticKHR{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR},
            [&](uint32_t* n, VkPipelineExecutableStatisticKHR* out) { return get_statistics_(device_, &which, n, out); },
            "vkGetPipelineExecutableStatisticsKHR");
        // One executable (a compute pipeline's usual case): the statistics' own names.
        const std::string prefix = executables.size() > 1 ? std::string(executables[e].name) + ": " : "";
        for (const auto& s : statistics) kept.emplace_back(prefix + s.name, statistic_value(s));
    }
}

}  // namespace rk::vk
