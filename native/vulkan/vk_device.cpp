// The Vulkan context's bring-up and teardown: the loader, the instance (and the validation layer
// where RLKIT_VK_VALIDATION asks), the device's choice, its limits and features (cooperative
// matrices where the shaders were built for them), the queue, the memory pools and the command
// buffers in rotation.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "ops.hpp"
#include "vulkan/vk_context.hpp"

namespace rk::vk {

void check(VkResult result, const char* what) {
    if (result == VK_ERROR_OUT_OF_DEVICE_MEMORY || result == VK_ERROR_OUT_OF_HOST_MEMORY)
        throw OutOfMemory(std::string("out of GPU memory: Vulkan's ") + what + " failed (VkResult " +
                          std::to_string(int(result)) + "); free tensors or buffers, or use smaller ones");
    if (result != VK_SUCCESS)
        throw std::runtime_error(std::string("Vulkan: ") + what + " failed (VkResult " + std::to_string(int(result)) + ")");
}

namespace {

constexpr uint64_t kAlignment = 256;  // >= minStorageBufferOffsetAlignment everywhere
constexpr size_t kSlots = 3;          // command buffers in rotation

// The cooperative-matrix extension matmul_coopmat.comp was built for (CMakeLists.txt): KHR where
// the shader compiler knew GL_KHR_cooperative_matrix, else NV. The two query alike.
#if defined(RLKIT_COOPMAT_KHR)
#if !defined(VK_KHR_cooperative_matrix)
// VK_KHR_cooperative_matrix as the Vulkan registry defines it, for headers older than 1.3.255.
#define VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME "VK_KHR_cooperative_matrix"
constexpr VkStructureType VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR = VkStructureType(1000506000);
constexpr VkStructureType VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR = VkStructureType(1000506001);
struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void* pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
};
struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void* pNext;
    uint32_t MSize, NSize, KSize;
    VkComponentTypeNV AType, BType, CType, ResultType;  // the KHR enums have the NV values
    VkBool32 saturatingAccumulation;
    VkScopeNV scope;
};
using PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR = VkResult(VKAPI_PTR*)(VkPhysicalDevice, uint32_t*,
                                                                                    VkCooperativeMatrixPropertiesKHR*);
#endif
using CoopmatFeatures = VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
using CoopmatProperties = VkCooperativeMatrixPropertiesKHR;
using PFN_coopmat_properties = PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR;
constexpr VkStructureType kCoopmatFeatures = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR;
constexpr VkStructureType kCoopmatProperties = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
constexpr const char* kCoopmatExtension = VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME;
constexpr const char* kCoopmatPropertiesFunction = "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR";
int result_type(const CoopmatProperties& p) { return int(p.ResultType); }
#else
using CoopmatFeatures = VkPhysicalDeviceCooperativeMatrixFeaturesNV;
using CoopmatProperties = VkCooperativeMatrixPropertiesNV;
using PFN_coopmat_properties = PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV;
constexpr VkStructureType kCoopmatFeatures = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
constexpr VkStructureType kCoopmatProperties = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
constexpr const char* kCoopmatExtension = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
constexpr const char* kCoopmatPropertiesFunction = "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV";
int result_type(const CoopmatProperties& p) { return int(p.DType); }
#endif

#if defined(RLKIT_COOPMAT_BF16)
#if !defined(VK_KHR_shader_bfloat16)
// VK_KHR_shader_bfloat16 as the Vulkan registry defines it, for headers older than 1.4.311.
#define VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME "VK_KHR_shader_bfloat16"
constexpr VkStructureType VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR = VkStructureType(1000141000);
struct VkPhysicalDeviceShaderBfloat16FeaturesKHR {
    VkStructureType sType;
    void* pNext;
    VkBool32 shaderBFloat16Type;
    VkBool32 shaderBFloat16DotProduct;
    VkBool32 shaderBFloat16CooperativeMatrix;
};
#endif
constexpr int kComponentBfloat16 = 1000141000;  // VK_COMPONENT_TYPE_BFLOAT16_KHR
#endif

bool env_flag(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                    VkDebugUtilsMessageTypeFlagsEXT,
                                                    const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
    if (severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        auto* ctx = static_cast<Context*>(user);
        const bool error = severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        if (ctx->provoking_) {  // the self-test's deliberate mistake: counted apart, not an error of rlkit
            if (error) ++ctx->provoked_errors_;
            std::fprintf(stderr, "[rlkit vulkan validation, provoked by the self-test] %s\n", data->pMessage);
            return VK_FALSE;
        }
        if (error) ++ctx->validation_errors_;
        std::fprintf(stderr, "[rlkit vulkan validation] %s\n", data->pMessage);
    }
    return VK_FALSE;
}

Context* Context::get(std::string* why) {
    // Never destroyed: tensors may outlive any static destructor, and their storage returns to
    // the context's pools; the process's exit releases the device.
    static Context* ctx = nullptr;
    static std::string failure;
    static std::once_flag once;
    std::call_once(once, [] {
        auto* c = new Context();
        try {
            c->init(&failure);
        } catch (const std::exception& e) {
            failure = e.what();
        }
        if (failure.empty()) ctx = c;
    });
    if (!ctx) *why = failure;
    return ctx;
}

void Context::init(std::string* why) {
    loader_ = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!loader_) loader_ = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!loader_) {
        *why = "the Vulkan loader (libvulkan.so.1) is not installed: install it and a driver (Debian: apt-get "
               "install libvulkan1 mesa-vulkan-drivers for a CPU software device; on an NVIDIA or AMD GPU its "
               "vendor driver)";
        return;
    }
    api_.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(loader_, "vkGetInstanceProcAddr"));
#define RK_LOAD_GLOBAL(name) api_.name = reinterpret_cast<PFN_##name>(api_.vkGetInstanceProcAddr(nullptr, #name));
    RK_VK_GLOBAL_FUNCTIONS(RK_LOAD_GLOBAL)
#undef RK_LOAD_GLOBAL

    const bool validate = env_flag("RLKIT_VK_VALIDATION");
    std::vector<const char*> layers, extensions;
    if (validate) {
        uint32_t n = 0;
        api_.vkEnumerateInstanceLayerProperties(&n, nullptr);
        std::vector<VkLayerProperties> props(n);
        api_.vkEnumerateInstanceLayerProperties(&n, props.data());
        bool found = std::any_of(props.begin(), props.end(), [](const VkLayerProperties& p) {
            return std::strcmp(p.layerName, "VK_LAYER_KHRONOS_validation") == 0;
        });
        if (!found) {
            *why = "RLKIT_VK_VALIDATION is set but VK_LAYER_KHRONOS_validation is not installed "
                   "(Debian: apt-get install vulkan-validationlayers)";
            return;
        }
        layers.push_back("VK_LAYER_KHRONOS_validation");
        extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    }
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "rlkit";
    app.apiVersion = VK_API_VERSION_1_2;
    VkValidationFeatureEnableEXT sync_validation = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = &sync_validation;
    VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, validate ? &features : nullptr};
    ici.pApplicationInfo = &app;
    ici.enabledLayerCount = uint32_t(layers.size());
    ici.ppEnabledLayerNames = layers.data();
    ici.enabledExtensionCount = uint32_t(extensions.size());
    ici.ppEnabledExtensionNames = extensions.data();
    VkResult r = api_.vkCreateInstance(&ici, nullptr, &instance_);
    if (r != VK_SUCCESS) {
        *why = "vkCreateInstance failed (VkResult " + std::to_string(int(r)) +
               "): no Vulkan driver is installed (Debian: apt-get install mesa-vulkan-drivers, or the GPU vendor's)";
        return;
    }
#define RK_LOAD_INSTANCE(name) api_.name = reinterpret_cast<PFN_##name>(api_.vkGetInstanceProcAddr(instance_, #name));
    RK_VK_INSTANCE_FUNCTIONS(RK_LOAD_INSTANCE)
#undef RK_LOAD_INSTANCE
    if (validate) {
        auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
            api_.vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
        VkDebugUtilsMessengerCreateInfoEXT mci{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
        mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                          VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        mci.pfnUserCallback = on_validation_message;
        mci.pUserData = this;
        check(create(instance_, &mci, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
    }

    uint32_t n = 0;
    api_.vkEnumeratePhysicalDevices(instance_, &n, nullptr);
    std::vector<VkPhysicalDevice> devices(n);
    api_.vkEnumeratePhysicalDevices(instance_, &n, devices.data());
    if (devices.empty()) {
        *why = "the Vulkan loader found no device: install a driver (Debian: apt-get install mesa-vulkan-drivers)";
        return;
    }
    // A discrete GPU first, then integrated, virtual, and software (lavapipe) last; or RLKIT_VK_DEVICE.
    auto rank = [&](VkPhysicalDevice d) {
        VkPhysicalDeviceProperties p;
        api_.vkGetPhysicalDeviceProperties(d, &p);
        switch (p.deviceType) {
            case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
            case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
            case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
            default: return 3;
        }
    };
    std::stable_sort(devices.begin(), devices.end(), [&](auto a, auto b) { return rank(a) < rank(b); });
    if (const char* pick = std::getenv("RLKIT_VK_DEVICE")) {
        const int i = std::atoi(pick);
        if (i < 0 || i >= int(devices.size())) {
            *why = "RLKIT_VK_DEVICE=" + std::string(pick) + " but there are " + std::to_string(devices.size()) + " devices";
            return;
        }
        physical_ = devices[i];
    } else if (const char* local_rank = std::getenv("RLKIT_VK_DEVICE_FOR_RANK")) {
        // data-parallel ranks (rlkit.core.parallel): rank k takes hardware GPU k modulo their
        // number, so ranks share GPUs only when there are fewer GPUs than ranks
        const int hardware = int(std::count_if(devices.begin(), devices.end(), [&](auto d) { return rank(d) < 3; }));
        physical_ = devices[hardware > 0 ? std::max(0, std::atoi(local_rank)) % hardware : 0];
    } else {
        physical_ = devices[0];
    }

    VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup};
    api_.vkGetPhysicalDeviceProperties2(physical_, &props2);
    const VkPhysicalDeviceLimits& lim = props2.properties.limits;
    device_name_ = props2.properties.deviceName;
    if (device_name_.find("llvmpipe") != std::string::npos) limits_.loop_iterations = 65535;
    limits_.subgroup_size = subgroup.subgroupSize;
    limits_.subgroup_arithmetic = (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                                  (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT);
    limits_.subgroup_quad = (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_QUAD_BIT) &&
                            (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && subgroup.subgroupSize >= 4;
    limits_.max_shared_memory = lim.maxComputeSharedMemorySize;
    limits_.max_push_constants = lim.maxPushConstantsSize;
    limits_.max_group_count_x = lim.maxComputeWorkGroupCount[0];
    limits_.max_group_count_z = lim.maxComputeWorkGroupCount[2];
    if (lim.maxPushConstantsSize < kPushConstantBytes) {
        *why = device_name_ + " offers " + std::to_string(lim.maxPushConstantsSize) + " bytes of push constants; rlkit needs 128";
        return;
    }

    auto has_extension = [&](const char* name) {
        uint32_t count = 0;
        api_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &count, nullptr);
        std::vector<VkExtensionProperties> all(count);
        api_.vkEnumerateDeviceExtensionProperties(physical_, nullptr, &count, all.data());
        return std::any_of(all.begin(), all.end(),
                           [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
    };
    // Whether the device lists the fragment matmul_coopmat.comp multiplies: 16x16x16, A and B of
    // this component type, f32 C and result, subgroup scope.
    auto has_fragment = [&](int component) {
        auto properties = reinterpret_cast<PFN_coopmat_properties>(
            api_.vkGetInstanceProcAddr(instance_, kCoopmatPropertiesFunction));
        if (!properties) return false;
        uint32_t count = 0;
        properties(physical_, &count, nullptr);
        CoopmatProperties blank{};
        blank.sType = kCoopmatProperties;
        std::vector<CoopmatProperties> all(count, blank);
        properties(physical_, &count, all.data());
        return std::any_of(all.begin(), all.end(), [&](const CoopmatProperties& p) {
            return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 && int(p.AType) == component &&
                   int(p.BType) == component && p.CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                   result_type(p) == VK_COMPONENT_TYPE_FLOAT32_NV && p.scope == VK_SCOPE_SUBGROUP_NV;
        });
    };
    CoopmatFeatures fcoop{};
    fcoop.sType = kCoopmatFeatures;
#if defined(RLKIT_COOPMAT_BF16)
    VkPhysicalDeviceShaderBfloat16FeaturesKHR fbf16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR};
    if (has_extension(VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME)) fcoop.pNext = &fbf16;
#endif
    VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &fcoop};
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &f11};
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR fexec{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, &f12};
    const bool want_statistics = env_flag("RLKIT_VK_PIPELINE_STATISTICS") &&
                                 has_extension(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                 want_statistics ? static_cast<void*>(&fexec) : static_cast<void*>(&f12)};
    api_.vkGetPhysicalDeviceFeatures2(physical_, &f2);
    if (!f12.bufferDeviceAddress || !f2.features.shaderInt64) {
        *why = device_name_ + " lacks bufferDeviceAddress or shaderInt64, which rlkit's shaders use";
        return;
    }
    limits_.cooperative_matrix_f16 = has_extension(kCoopmatExtension) && fcoop.cooperativeMatrix &&
                                     f11.storageBuffer16BitAccess && f12.shaderFloat16 && f12.vulkanMemoryModel &&
                                     limits_.subgroup_size == 32 && has_fragment(VK_COMPONENT_TYPE_FLOAT16_NV) &&
                                     !env_flag("RLKIT_VK_NO_COOPMAT");
#if defined(RLKIT_COOPMAT_BF16)
    limits_.cooperative_matrix_bf16 = limits_.cooperative_matrix_f16 && fbf16.shaderBFloat16Type &&
                                      fbf16.shaderBFloat16CooperativeMatrix && has_fragment(kComponentBfloat16);
#endif

    uint32_t nq = 0;
    api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> families(nq);
    api_.vkGetPhysicalDeviceQueueFamilyProperties(physical_, &nq, families.data());
    queue_family_ = nq;
    for (uint32_t i = 0; i < nq; ++i)
        if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            queue_family_ = i;
            break;
        }
    if (queue_family_ == nq) {
        *why = device_name_ + " has no compute queue";
        return;
    }
    limits_.timestamp_bits = families[queue_family_].timestampValidBits;
    limits_.timestamp_period_ns = limits_.timestamp_bits > 0 ? lim.timestampPeriod : 0.0;

    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = queue_family_;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    // The cooperative-matrix kernel's features are enabled only where it will run (lavapipe and
    // others get the device they always got).
    const bool coop = limits_.cooperative_matrix_f16;
    CoopmatFeatures enable_coop{};
    enable_coop.sType = kCoopmatFeatures;
    enable_coop.cooperativeMatrix = VK_TRUE;
    std::vector<const char*> device_extensions;
    if (coop) device_extensions.push_back(kCoopmatExtension);
#if defined(RLKIT_COOPMAT_BF16)
    VkPhysicalDeviceShaderBfloat16FeaturesKHR enable_bf16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR};
    enable_bf16.shaderBFloat16Type = VK_TRUE;
    enable_bf16.shaderBFloat16CooperativeMatrix = VK_TRUE;
    if (limits_.cooperative_matrix_bf16) {
        enable_coop.pNext = &enable_bf16;
        device_extensions.push_back(VK_KHR_SHADER_BFLOAT16_EXTENSION_NAME);
    }
#endif
    VkPhysicalDeviceVulkan11Features enable11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                              coop ? &enable_coop : nullptr};
    enable11.storageBuffer16BitAccess = coop;
    VkPhysicalDeviceVulkan12Features enable12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &enable11};
    enable12.bufferDeviceAddress = VK_TRUE;
    enable12.shaderFloat16 = coop;
    enable12.vulkanMemoryModel = coop;
    VkPhysicalDeviceFeatures2 enable{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &enable12};
    enable.features.shaderInt64 = VK_TRUE;
    // The compiler's statistics per pipeline, only on request (capturing them may slow the
    // pipelines' creation).
    const bool statistics = want_statistics && fexec.pipelineExecutableInfo;
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR enable_exec{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, &enable12};
    enable_exec.pipelineExecutableInfo = VK_TRUE;
    if (statistics) {
        enable.pNext = &enable_exec;
        device_extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    }
    VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &enable};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = uint32_t(device_extensions.size());
    dci.ppEnabledExtensionNames = device_extensions.empty() ? nullptr : device_extensions.data();
    check(api_.vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
#define RK_LOAD_DEVICE(name) api_.name = reinterpret_cast<PFN_##name>(api_.vkGetDeviceProcAddr(device_, #name));
    RK_VK_DEVICE_FUNCTIONS(RK_LOAD_DEVICE)
#undef RK_LOAD_DEVICE
    if (statistics) {
        get_executables_ = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
            api_.vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
        get_statistics_ = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
            api_.vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
        if (!get_executables_ || !get_statistics_) {  // both or neither
            get_executables_ = nullptr;
            get_statistics_ = nullptr;
        }
    }
    api_.vkGetDeviceQueue(device_, queue_family_, 0, &queue_);

    VkPhysicalDeviceMemoryProperties mem;
    api_.vkGetPhysicalDeviceMemoryProperties(physical_, &mem);
    auto find_type = [&](VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) -> int {
        for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
            const auto f = mem.memoryTypes[i].propertyFlags;
            if ((f & want) == want && !(f & avoid)) return int(i);
        }
        return -1;
    };
    int device_type = find_type(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (device_type < 0) device_type = find_type(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    // Staging serves uploads and reads: host-visible, coherent, and cached where offered.
    int staging_type = find_type(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                     VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
    if (staging_type < 0)
        staging_type = find_type(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
    if (device_type < 0 || staging_type < 0) {
        *why = device_name_ + " offers no usable device-local and host-visible memory types";
        return;
    }
    device_memory_ = mem.memoryHeaps[mem.memoryTypes[device_type].heapIndex].size;
    const uint64_t block = std::min<uint64_t>(uint64_t(256) << 20, device_memory_ / 8);
    device_pool_ = std::make_unique<MemoryPool>(api_, device_, uint32_t(device_type), false, block, kAlignment);
    staging_pool_ = std::make_unique<MemoryPool>(api_, device_, uint32_t(staging_type), true, uint64_t(64) << 20, kAlignment);

    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = queue_family_;
    check(api_.vkCreateCommandPool(device_, &pci, nullptr, &pool_), "vkCreateCommandPool");
    slots_.resize(kSlots);
    for (auto& slot : slots_) {
        const ProgramCommands made = new_commands();
        slot.cmd = made.cmd;
        slot.fence = made.fence;
    }

    VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
    VkPipelineLayoutCreateInfo lci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    lci.pushConstantRangeCount = 1;
    lci.pPushConstantRanges = &push;
    check(api_.vkCreatePipelineLayout(device_, &lci, nullptr, &layout_), "vkCreatePipelineLayout");
}

Context::~Context() {
    if (!device_) return;
    api_.vkDeviceWaitIdle(device_);
    in_flight_.clear();
    for (auto& [name, p] : pipelines_) api_.vkDestroyPipeline(device_, p, nullptr);
    api_.vkDestroyPipelineLayout(device_, layout_, nullptr);
    for (auto& slot : slots_) {
        slot.keep.clear();
        api_.vkDestroyFence(device_, slot.fence, nullptr);
    }
    for (auto& spare : spare_program_commands_) api_.vkDestroyFence(device_, spare.fence, nullptr);
    api_.vkDestroyCommandPool(device_, pool_, nullptr);
    device_pool_.reset();
    staging_pool_.reset();
    api_.vkDestroyDevice(device_, nullptr);
    if (messenger_) {
        auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
            api_.vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
        destroy(instance_, messenger_, nullptr);
    }
    api_.vkDestroyInstance(instance_, nullptr);
}

int Context::provoke_validation_error() {
    if (!validating()) return -1;
    provoking_ = true;
    provoked_errors_ = 0;
    VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    info.size = 0;  // invalid (VUID-VkBufferCreateInfo-size-00912): the layer reports it and stops the call
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkBuffer buffer = VK_NULL_HANDLE;
    if (api_.vkCreateBuffer(device_, &info, nullptr, &buffer) == VK_SUCCESS && buffer != VK_NULL_HANDLE)
        api_.vkDestroyBuffer(device_, buffer, nullptr);
    provoking_ = false;
    return provoked_errors_;
}

}  // namespace rk::vk
