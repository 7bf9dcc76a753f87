//! Which K/V cache pairs a tune searches: each type for both, and K one step more precise than V
//! where every device the layers may go to runs that mixed pair with flash attention. Each device is
//! asked, in a worker, the way llama.cpp's scheduler asks it (`llama::runs_kv_pair`: its
//! `supports_op` for the attention op with this model's head sizes, then the op computed once over
//! a tiny cache), not allowed by its backend's name: a CUDA build without
//! `GGML_CUDA_FA_ALL_QUANTS` declines mixed pairs, a Vulkan device with subgroup operations runs
//! them. RPC servers are not asked: they say yes to every op (ggml-rpc does not ask the server), and
//! a kernel that aborts there would end the user's server; they get pairs of one type.

use crate::llama::AttentionShape;
use crate::machine::Machine;
use crate::worker::protocol::KvPairsRequest;
use crate::worker::{Request, Response, Worker};
use search_space::gguf::GgufInfo;
use search_space::CacheType;
use std::time::Duration;

/// The mixed pairs each device said it runs (device name → pairs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairSupport(pub Vec<(String, Vec<(CacheType, CacheType)>)>);

/// The devices the layers may go to, other than the CPU (which runs every pair) and RPC servers.
fn asked_devices(machine: &Machine) -> Vec<String> {
    (machine.offload_devices().into_iter())
        .chain(machine.other_backends.iter().map(|o| &o.device))
        .filter(|d| !d.is_rpc())
        .map(|d| d.name.clone())
        .collect()
}

/// The K/V pairs to search: each type for both, and the mixed pairs every offload device runs
/// (`support`, asked of them; an RPC server is never asked, so it runs none).
pub fn kv_pairs_for(
    types: &[CacheType],
    machine: &Machine,
    support: &PairSupport,
) -> Vec<(CacheType, CacheType)> {
    let devices: Vec<&str> = (machine.offload_devices().into_iter())
        .chain(machine.other_backends.iter().map(|o| &o.device))
        .map(|d| d.name.as_str())
        .collect();
    search_space::kv_pairs(types, |k, v| {
        devices
            .iter()
            .all(|d| (support.0.iter()).any(|(name, pairs)| name == d && pairs.contains(&(k, v))))
    })
}

/// Asks every offload device which of the mixed pairs of `types` it runs with this model's
/// attention, in a worker of its own (a kernel that aborts ends that worker, not the tune): none
/// asked where there is no such device or no mixed pair; a worker that fails answers none.
pub fn ask_devices(types: &[CacheType], machine: &Machine, info: &GgufInfo) -> PairSupport {
    let devices = asked_devices(machine);
    let pairs: Vec<(CacheType, CacheType)> = search_space::kv_pairs(types, |_, _| true)
        .into_iter()
        .filter(|(k, v)| k != v)
        .collect();
    let Some(shape) = attention_shape(info) else {
        return PairSupport::default();
    };
    if devices.is_empty() || pairs.is_empty() {
        return PairSupport::default();
    }
    let request = Request::KvPairs(KvPairsRequest {
        devices,
        pairs,
        shape,
    });
    let Ok(mut worker) = Worker::spawn() else {
        return PairSupport::default();
    };
    let answer = worker.call(&request, Duration::from_secs(120), &|| false);
    worker.quit();
    match answer {
        Ok(Response::KvPairs { runs }) => PairSupport(runs),
        _ => PairSupport::default(),
    }
}

/// The model's attention: K and V head sizes from its first layer's K and V projections (their
/// output width over the K/V heads), else the embedding width over the heads.
pub fn attention_shape(info: &GgufInfo) -> Option<AttentionShape> {
    let n_head = u32::try_from(info.head_count?).ok()?;
    let n_head_kv = info
        .head_count_kv
        .map_or(Some(n_head), |n| u32::try_from(n).ok())?;
    let width = |name: &str| {
        (info.tensors.iter())
            .find(|t| t.name == name)
            .and_then(|t| t.dims.get(1).copied())
            .and_then(|w| u32::try_from(w / u64::from(n_head_kv.max(1))).ok())
    };
    let fallback = u32::try_from(info.embedding_length? / u64::from(n_head.max(1))).ok()?;
    let head_k = width("blk.0.attn_k.weight").unwrap_or(fallback);
    Some(AttentionShape {
        head_k,
        head_v: width("blk.0.attn_v.weight").unwrap_or(head_k),
        n_head,
        n_head_kv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::tests::machine;

    #[test]
    fn mixed_kv_pairs_only_where_every_device_said_it_runs_them() {
        use CacheType::*;
        let types = [F16, Q8_0, Q4_0];
        let same = vec![(F16, F16), (Q8_0, Q8_0), (Q4_0, Q4_0)];
        let mut all = same.clone();
        all.extend([(F16, Q8_0), (Q8_0, Q4_0)]);
        let none = PairSupport::default();
        // The CPU runs every pair: nothing to ask.
        let cpu = machine(&[("CPU", "CPU", "cpu")]);
        assert!(asked_devices(&cpu).is_empty());
        assert_eq!(kv_pairs_for(&types, &cpu, &none), all);
        // A GPU that declined them (CUDA built without GGML_CUDA_FA_ALL_QUANTS), or was not asked.
        let cuda = machine(&[("CPU", "CPU", "cpu"), ("CUDA0", "CUDA", "gpu")]);
        assert_eq!(asked_devices(&cuda), ["CUDA0"]);
        assert_eq!(kv_pairs_for(&types, &cuda, &none), same);
        let declined = PairSupport(vec![("CUDA0".into(), Vec::new())]);
        assert_eq!(kv_pairs_for(&types, &cuda, &declined), same);
        // A Vulkan GPU that runs them: asked, not ruled out by its backend's name.
        let vulkan = machine(&[("CPU", "CPU", "cpu"), ("Vulkan0", "Vulkan", "gpu")]);
        let runs = PairSupport(vec![("Vulkan0".into(), vec![(F16, Q8_0), (Q8_0, Q4_0)])]);
        assert_eq!(kv_pairs_for(&types, &vulkan, &runs), all);
        // Two GPUs: a pair only one runs is not searched.
        let two = machine(&[
            ("CPU", "CPU", "cpu"),
            ("CUDA0", "CUDA", "gpu"),
            ("Vulkan0", "Vulkan", "gpu"),
        ]);
        let one = PairSupport(vec![
            ("Vulkan0".into(), vec![(F16, Q8_0), (Q8_0, Q4_0)]),
            ("CUDA0".into(), vec![(F16, Q8_0)]),
        ]);
        let mut some = same.clone();
        some.push((F16, Q8_0));
        assert_eq!(kv_pairs_for(&types, &two, &one), some);
    }

    #[test]
    fn the_attention_shape_comes_from_the_k_and_v_projections() {
        use search_space::testfiles::{ggml, GgufBuilder};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        // Gemma 3 270M's shape: 640 wide, 4 heads, 1 K/V head of 256.
        GgufBuilder::new("gemma3")
            .kv_u32("gemma3.embedding_length", 640)
            .kv_u32("gemma3.attention.head_count", 4)
            .kv_u32("gemma3.attention.head_count_kv", 1)
            .tensor("blk.0.attn_k.weight", ggml::F16, &[640, 256])
            .tensor("blk.0.attn_v.weight", ggml::F16, &[640, 256])
            .write_to(&path)
            .unwrap();
        let info = GgufInfo::inspect(&path).unwrap();
        let s = attention_shape(&info).expect("a shape");
        assert_eq!(
            (s.head_k, s.head_v, s.n_head, s.n_head_kv),
            (256, 256, 4, 1)
        );
    }
}
