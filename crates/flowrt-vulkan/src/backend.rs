//! The [`flowrt_dispatch::Backend`] over a Vulkan device.

use std::sync::Arc;

use flowrt_dispatch::BackendSettings;
use flowrt_model::Model;

use crate::error::VulkanError;

/// The Vulkan backend for one model instance.
pub struct VulkanBackend {
    _model: Arc<Model>,
}

impl VulkanBackend {
    /// Open the device `settings.device` names (or the default one), upload the weights and
    /// allocate the KV cache and activations.
    pub fn new(model: Arc<Model>, settings: &BackendSettings) -> Result<Self, VulkanError> {
        let _ = (model, settings);
        Err(VulkanError::Unsupported(
            "the Vulkan backend is not built yet".into(),
        ))
    }
}
