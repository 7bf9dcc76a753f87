//! The memory each device may hold in a run: what `--mem-budget DEVICE=SIZE` gave, else the
//! device's free memory less the margin kept free. One type from the flag to the profile, so a
//! profile says the budgets its winner was chosen under and every lookup is the same one.

use serde::{Deserialize, Serialize};

/// One device's budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBudget {
    /// llama.cpp's device name (`CPU`, `CUDA0`, `RPC0`).
    pub device: String,
    pub bytes: u64,
    /// Given with `--mem-budget` (else the free memory less the margin).
    #[serde(default)]
    pub given: bool,
    /// The same GPU's names through the other backends that drive it (`Vulkan0` beside `CUDA0`):
    /// one GPU has one budget, whichever backend a configuration reaches it through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_gpu: Vec<String>,
}

impl DeviceBudget {
    /// Whether `name` is this device, by its own name or by another backend's for the same GPU.
    pub fn names(&self, name: &str) -> bool {
        self.device == name || self.same_gpu.iter().any(|n| n == name)
    }
}

impl std::str::FromStr for DeviceBudget {
    type Err = String;
    /// `DEVICE=SIZE` as `--mem-budget` takes it (the device is checked against the machine later).
    fn from_str(item: &str) -> Result<Self, String> {
        let (dev, size) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}': write DEVICE=SIZE, e.g. RPC0=300M"))?;
        let bytes = search_space::size::parse_size(size).map_err(|e| format!("{dev}: {e}"))?;
        Ok(DeviceBudget {
            device: dev.to_string(),
            bytes,
            given: true,
            same_gpu: Vec::new(),
        })
    }
}

/// Every device's budget, in the machine's device order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Budgets(pub Vec<DeviceBudget>);

impl Budgets {
    /// The bytes `device` may hold, when it has a budget: a GPU's through any backend that drives
    /// it (`Vulkan0` has `CUDA0`'s budget where both are the same GPU).
    pub fn of(&self, device: &str) -> Option<u64> {
        self.entry(device).map(|b| b.bytes)
    }

    /// The budget of `device`, named by any backend that drives it.
    pub fn entry(&self, device: &str) -> Option<&DeviceBudget> {
        self.0.iter().find(|b| b.names(device))
    }

    /// Whether a GPU is driven by several backends (its budget names it more than once).
    pub fn has_same_gpus(&self) -> bool {
        self.0.iter().any(|b| !b.same_gpu.is_empty())
    }

    pub fn iter(&self) -> impl Iterator<Item = &DeviceBudget> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The budgets of the devices other than the host's (`CPU`).
    pub fn offload(&self) -> impl Iterator<Item = &DeviceBudget> {
        self.0.iter().filter(|b| b.device != "CPU")
    }

    /// (device, bytes) pairs, as llama.cpp's fit request carries them.
    pub fn pairs(&self) -> Vec<(String, u64)> {
        self.0.iter().map(|b| (b.device.clone(), b.bytes)).collect()
    }

    /// The budgets given with `--mem-budget`, as the flag writes them (`CUDA0=2.1GiB`).
    pub fn given(&self) -> Vec<String> {
        (self.0.iter())
            .filter(|b| b.given)
            .map(|b| format!("{}={}", b.device, search_space::size::format_size(b.bytes)))
            .collect()
    }
}

impl FromIterator<(String, u64)> for Budgets {
    /// Budgets not given with the flag (a test's, a simulator's).
    fn from_iter<I: IntoIterator<Item = (String, u64)>>(it: I) -> Self {
        Budgets(
            it.into_iter()
                .map(|(device, bytes)| DeviceBudget {
                    device,
                    bytes,
                    given: false,
                    same_gpu: Vec::new(),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_value_parses_and_lookups_find_devices() {
        let b: DeviceBudget = "RPC0=300M".parse().unwrap();
        assert_eq!(
            (b.device.as_str(), b.bytes, b.given),
            ("RPC0", 300 << 20, true)
        );
        assert!("RPC0".parse::<DeviceBudget>().is_err());
        assert!("RPC0=lots".parse::<DeviceBudget>().is_err());
        let all = Budgets(vec![
            DeviceBudget {
                device: "CPU".into(),
                bytes: 8 << 30,
                given: false,
                same_gpu: Vec::new(),
            },
            b,
        ]);
        assert_eq!(all.of("RPC0"), Some(300 << 20));
        assert_eq!(all.of("CUDA0"), None);
        assert_eq!(all.offload().count(), 1);
        assert_eq!(all.given(), ["RPC0=300.0 MiB"]);
        assert!(!all.has_same_gpus());
    }

    #[test]
    fn one_gpu_through_two_backends_has_one_budget() {
        let mut gpu: DeviceBudget = "CUDA0=10G".parse().unwrap();
        gpu.same_gpu = vec!["Vulkan0".into()];
        let all = Budgets(vec![gpu, "CUDA1=4G".parse().unwrap()]);
        assert_eq!(all.of("Vulkan0"), Some(10 << 30));
        assert_eq!(all.of("CUDA0"), Some(10 << 30));
        assert_eq!(all.of("Vulkan1"), None);
        assert_eq!(all.offload().count(), 2, "a GPU is counted once");
        assert!(all.has_same_gpus());
        // Through TOML, the other names stay with the budget.
        #[derive(Serialize, Deserialize)]
        struct W {
            budgets: Budgets,
        }
        let text = toml::to_string(&W {
            budgets: all.clone(),
        })
        .unwrap();
        assert!(text.contains("same_gpu = [\"Vulkan0\"]"), "{text}");
        let back: W = toml::from_str(&text).unwrap();
        assert_eq!(back.budgets, all);
    }

    #[test]
    fn a_profile_keeps_its_budgets_and_quality_record_through_toml() {
        let mut p = crate::fixture::example_profile();
        p.budgets = Budgets(vec![
            DeviceBudget {
                device: "CPU".into(),
                bytes: 30 << 30,
                given: false,
                same_gpu: Vec::new(),
            },
            "CUDA0=2178M".parse().unwrap(),
        ]);
        p.quality = Some(crate::QualityRecord {
            max_kv_kld: Some(0.02),
            unchecked: None,
            text: "text".into(),
            window: 1024,
            tokens: 2048,
            checks: vec![crate::KvQualityCheck {
                type_k: search_space::CacheType::Q8_0,
                type_v: search_space::CacheType::Q4_0,
                figures: None,
                passed: false,
                error: Some("no figures".into()),
                cached: false,
                seconds: 1.5,
                measured_with: Some(crate::MeasuredWith {
                    llama: "b7400 (commit abc1234)".into(),
                    backend: "CUDA".into(),
                    flash_attn: search_space::FlashAttn::On,
                }),
                against: Some("F16".into()),
                weights_kld: Some(0.03),
                attn_rot: Default::default(),
            }],
        });
        let text = p.to_toml().unwrap();
        assert!(
            text.contains("[quality]") && text.contains("[[budgets]]"),
            "{text}"
        );
        let (back, warnings) = crate::Profile::from_toml(&text).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back, p);
    }
}
