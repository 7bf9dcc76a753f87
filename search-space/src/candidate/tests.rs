//! The candidate's unit and property tests.

use super::*;

#[test]
fn cache_types_round_trip_through_their_names() {
    for t in CacheType::ALL {
        assert_eq!(t.as_str().parse::<CacheType>().unwrap(), t);
    }
    let err = "q3_x".parse::<CacheType>().unwrap_err();
    assert!(err.to_string().contains("q8_0"), "{err}");
}

#[test]
fn quantized_v_cache_needs_flash_attention() {
    let mut c = Candidate::llama_default(2, 0);
    c.type_v = CacheType::Q4_0;
    c.flash_attn = FlashAttn::Off;
    assert!(matches!(
        c.validate(),
        Err(InvalidCandidate::QuantizedVWithoutFlashAttn { .. })
    ));
    c.flash_attn = FlashAttn::On;
    assert!(c.validate().is_ok());
}

#[test]
fn default_is_simplest() {
    let d = Candidate::llama_default(4, 0);
    assert_eq!(d.complexity(), 0);
    let mut c = d.clone();
    c.type_k = CacheType::Q8_0;
    assert_eq!(c.complexity(), 1);
}

#[test]
fn prompt_threads_are_spelled_only_when_they_differ() {
    let d = Candidate::llama_default(8, 0);
    assert_eq!(d.with_threads(4, 8).threads_batch, Some(8));
    assert_eq!(d.with_threads(4, 8).batch_threads(), 8);
    assert_eq!(d.with_threads(4, 4), Candidate::llama_default(4, 0));
    assert_eq!(
        d.with_threads(4, 8).label(),
        "ngl=0 t=4 tb=8 b=2048/512 kv=f16/f16 fa=auto repack"
    );
    assert_eq!(d.with_threads(4, 8).complexity(), 1);
    let mut z = d.clone();
    z.threads_batch = Some(0);
    assert_eq!(z.validate(), Err(InvalidCandidate::ZeroThreads));
}

#[test]
fn ubatch_over_batch_is_rejected() {
    let mut c = Candidate::llama_default(2, 0);
    c.n_ubatch = 4096;
    assert!(c.validate().is_err());
}

#[test]
fn tensor_parallelism_needs_flash_attention() {
    let mut c = Candidate::llama_default(2, 99);
    c.split_mode = "tensor".parse().unwrap();
    c.flash_attn = FlashAttn::Off;
    assert_eq!(
        c.validate(),
        Err(InvalidCandidate::TensorParallelWithoutFlashAttn)
    );
    c.flash_attn = FlashAttn::Auto;
    assert!(c.validate().is_ok());
    assert!(c.label().contains("sm=tensor"), "{}", c.label());
    // Nor a quantized KV cache (llama.cpp refuses it there).
    c.type_v = CacheType::Q8_0;
    assert_eq!(
        c.validate(),
        Err(InvalidCandidate::TensorParallelWithQuantizedCache {
            type_k: CacheType::F16,
            type_v: CacheType::Q8_0
        })
    );
}

#[test]
fn op_and_kv_offload_off_are_labelled_and_changed_knobs() {
    let mut c = Candidate::llama_default(2, 10);
    assert_eq!("off".parse::<OpOffload>().unwrap(), OpOffload::Off);
    assert!("sometimes".parse::<OpOffload>().is_err());
    c.op_offload = OpOffload::Off;
    assert!(c.label().ends_with(" no-op-offload"), "{}", c.label());
    assert_eq!(c.complexity(), 1);
    c.kv_offload = "off".parse().unwrap();
    assert!(c.label().ends_with(" nkvo no-op-offload"), "{}", c.label());
    assert_eq!(c.complexity(), 2);
}

#[test]
fn a_numa_strategy_is_labelled_a_changed_knob_and_a_model_setting() {
    let d = Candidate::llama_default(2, 0);
    let mut c = d.clone();
    assert_eq!("Distribute".parse::<Numa>().unwrap(), Numa::Distribute);
    assert_eq!("isolate".parse::<Numa>().unwrap(), Numa::Isolate);
    let e = "numactl".parse::<Numa>().unwrap_err().to_string();
    assert!(e.contains("off, distribute, isolate"), "{e}");
    c.numa = Numa::Distribute;
    assert!(c.label().ends_with(" numa=distribute"), "{}", c.label());
    assert_eq!(c.complexity(), 1);
    // Set once per process before the load: candidates that differ in it never share a model.
    assert_ne!(c.model_key(), d.model_key());
    // Off is llama.cpp's default and not written, so older profiles read the same.
    let json = serde_json::to_string(&d).unwrap();
    assert!(!json.contains("numa"), "{json}");
    let back: Candidate = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back.numa, Numa::Distribute);
}

#[test]
fn a_host_buffer_is_labelled_a_changed_knob_and_a_model_setting() {
    let d = Candidate::llama_default(2, 10);
    assert_eq!("no-host".parse::<HostBuffer>().unwrap(), HostBuffer::Cpu);
    assert_eq!("Pinned".parse::<HostBuffer>().unwrap(), HostBuffer::Pinned);
    let e = "locked".parse::<HostBuffer>().unwrap_err().to_string();
    assert!(e.contains("mapped, pinned, cpu"), "{e}");
    let mut c = d.clone();
    c.host_buffer = HostBuffer::Pinned;
    assert!(c.label().ends_with(" repack host=pinned"), "{}", c.label());
    assert_eq!(c.complexity(), 1);
    // Chosen at the load: candidates that differ in it never share a model.
    assert_ne!(c.model_key(), d.model_key());
    // Mapped is llama.cpp's default and not written, so older profiles and logs read the same.
    let json = serde_json::to_string(&d).unwrap();
    assert!(!json.contains("host_buffer"), "{json}");
    c.host_buffer = HostBuffer::Cpu;
    let back: Candidate = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back.host_buffer, HostBuffer::Cpu);
}

#[test]
fn kv_pairs_are_each_type_then_k_one_step_more_precise_than_v() {
    use CacheType::*;
    let all = |_, _| true;
    assert_eq!(
        kv_pairs(&[F16, Q8_0, Q4_0], all),
        [
            (F16, F16),
            (Q8_0, Q8_0),
            (Q4_0, Q4_0),
            (F16, Q8_0),
            (Q8_0, Q4_0)
        ]
    );
    // The user's order leads; the mixed pairs follow precision, not the order given.
    assert_eq!(
        kv_pairs(&[Q4_0, F16], all),
        [(Q4_0, Q4_0), (F16, F16), (F16, Q4_0)]
    );
    // A backend without kernels for mixed pairs gets each type for both alone.
    assert_eq!(
        kv_pairs(&[F16, Q8_0, Q4_0], |_, _| false),
        [(F16, F16), (Q8_0, Q8_0), (Q4_0, Q4_0)]
    );
    assert_eq!(kv_pairs(&[Q8_0], all), [(Q8_0, Q8_0)]);
}
