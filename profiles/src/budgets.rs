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
        })
    }
}

/// Every device's budget, in the machine's device order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Budgets(pub Vec<DeviceBudget>);

impl Budgets {
    /// The bytes `device` may hold, when it has a budget.
    pub fn of(&self, device: &str) -> Option<u64> {
        self.0.iter().find(|b| b.device == device).map(|b| b.bytes)
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
            },
            b,
        ]);
        assert_eq!(all.of("RPC0"), Some(300 << 20));
        assert_eq!(all.of("CUDA0"), None);
        assert_eq!(all.offload().count(), 1);
        assert_eq!(all.given(), ["RPC0=300.0 MiB"]);
    }

    #[test]
    fn a_profile_keeps_its_budgets_and_quality_record_through_toml() {
        let mut p = crate::fixture::example_profile();
        p.budgets = Budgets(vec![
            DeviceBudget {
                device: "CPU".into(),
                bytes: 30 << 30,
                given: false,
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
