// The Vulkan functions rlkit calls, loaded at run time from the system's loader (libvulkan.so.1)
// so that the module imports, and the CPU backend works, where no Vulkan exists at all.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <string>

namespace rk::vk {

#define RK_VK_GLOBAL_FUNCTIONS(X) \
    X(vkCreateInstance)           \
    X(vkEnumerateInstanceLayerProperties)

#define RK_VK_INSTANCE_FUNCTIONS(X)         \
    X(vkDestroyInstance)                    \
    X(vkEnumeratePhysicalDevices)           \
    X(vkGetPhysicalDeviceProperties)        \
    X(vkGetPhysicalDeviceProperties2)       \
    X(vkGetPhysicalDeviceFeatures2)         \
    X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkGetPhysicalDeviceMemoryProperties)  \
    X(vkEnumerateDeviceExtensionProperties) \
    X(vkCreateDevice)                       \
    X(vkGetDeviceProcAddr)

#define RK_VK_DEVICE_FUNCTIONS(X)       \
    X(vkDestroyDevice)                  \
    X(vkDeviceWaitIdle)                 \
    X(vkGetDeviceQueue)                 \
    X(vkQueueSubmit)                    \
    X(vkCreateCommandPool)              \
    X(vkDestroyCommandPool)             \
    X(vkAllocateCommandBuffers)         \
    X(vkFreeCommandBuffers)             \
    X(vkBeginCommandBuffer)             \
    X(vkEndCommandBuffer)               \
    X(vkResetCommandBuffer)             \
    X(vkCreateFence)                    \
    X(vkDestroyFence)                   \
    X(vkWaitForFences)                  \
    X(vkGetFenceStatus)                 \
    X(vkResetFences)                    \
    X(vkCreateEvent)                    \
    X(vkDestroyEvent)                   \
    X(vkGetEventStatus)                 \
    X(vkResetEvent)                     \
    X(vkCmdSetEvent)                    \
    X(vkCreateBuffer)                   \
    X(vkDestroyBuffer)                  \
    X(vkGetBufferMemoryRequirements)    \
    X(vkAllocateMemory)                 \
    X(vkFreeMemory)                     \
    X(vkBindBufferMemory)               \
    X(vkMapMemory)                      \
    X(vkUnmapMemory)                    \
    X(vkInvalidateMappedMemoryRanges)   \
    X(vkGetBufferDeviceAddress)         \
    X(vkCreateShaderModule)             \
    X(vkDestroyShaderModule)            \
    X(vkCreatePipelineLayout)           \
    X(vkDestroyPipelineLayout)          \
    X(vkCreateComputePipelines)         \
    X(vkDestroyPipeline)                \
    X(vkCmdBindPipeline)                \
    X(vkCmdPushConstants)               \
    X(vkCmdDispatch)                    \
    X(vkCmdPipelineBarrier)             \
    X(vkCmdCopyBuffer)                  \
    X(vkCmdFillBuffer)                  \
    X(vkCmdUpdateBuffer)                \
    X(vkCreateQueryPool)                \
    X(vkDestroyQueryPool)               \
    X(vkCmdResetQueryPool)              \
    X(vkCmdWriteTimestamp)              \
    X(vkGetQueryPoolResults)

struct Api {
#define RK_VK_MEMBER(name) PFN_##name name = nullptr;
    RK_VK_MEMBER(vkGetInstanceProcAddr)
    RK_VK_GLOBAL_FUNCTIONS(RK_VK_MEMBER)
    RK_VK_INSTANCE_FUNCTIONS(RK_VK_MEMBER)
    RK_VK_DEVICE_FUNCTIONS(RK_VK_MEMBER)
#undef RK_VK_MEMBER
};

// Throws std::runtime_error naming the call and the VkResult when a call fails.
void check(VkResult result, const char* what);

}  // namespace rk::vk
