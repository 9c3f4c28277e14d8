// Shader pipelines: one per embedded variant, made at its first dispatch, all with one layout
// (push constants only: shaders address tensors by buffer device address).
#include <stdexcept>
#include <string>

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
    VkPipeline p;
    VkResult r = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &cpci, nullptr, &p);
    api_.vkDestroyShaderModule(device_, module, nullptr);
    check(r, ("vkCreateComputePipelines(" + shader + ")").c_str());
    pipelines_[shader] = p;
    return p;
}

}  // namespace rk::vk
