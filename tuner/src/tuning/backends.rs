//! `--backend`: the backends a GPU several of them drive is measured through (the engine's
//! backend axis, `engine/backends.rs`), checked against what drives this machine's GPUs.

use crate::exit::{self, Exit};
use crate::machine::Machine;

/// The backends of the backend axis: those that drive a GPU another backend drives too, in
/// llama.cpp's order, or of them the ones `--backend` names, in its order. A name that drives no
/// GPU here is a usage error.
pub(super) fn backends_for(
    asked: Option<&[String]>,
    machine: &Machine,
) -> anyhow::Result<Vec<String>> {
    let driving = machine.gpu_backends();
    let Some(asked) = asked else {
        return Ok(driving);
    };
    let mut here: Vec<String> = Vec::new();
    for d in (machine.offload_devices().into_iter())
        .filter(|d| !d.is_rpc())
        .chain(machine.other_backends.iter().map(|o| &o.device))
    {
        if !here.contains(&d.backend) {
            here.push(d.backend.clone());
        }
    }
    let mut out = Vec::new();
    for a in asked {
        let Some(b) = here.iter().find(|b| b.eq_ignore_ascii_case(a)) else {
            let drive = if here.is_empty() {
                "none drives a GPU here".to_string()
            } else {
                format!("GPUs here are driven by {}", here.join(", "))
            };
            return Err(Exit::new(
                exit::USAGE,
                format!(
                    "--backend {a}: no GPU of this machine is driven by it ({drive}; `autotune doctor` says which modules are loaded and how to build others)"
                ),
            ));
        };
        if !out.contains(b) {
            out.push(b.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tuning::tests::machine;

    #[test]
    fn the_backend_axis_takes_every_backend_of_a_shared_gpu_or_those_asked_for() {
        let mut m = machine(&[("CPU", "CPU", "cpu"), ("CUDA0", "CUDA", "gpu")]);
        let asked = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // One backend per GPU: no axis; asking for the one there is no error.
        assert!(backends_for(None, &m).unwrap().is_empty());
        assert_eq!(backends_for(Some(&asked(&["cuda"])), &m).unwrap(), ["CUDA"]);
        let err = backends_for(Some(&asked(&["vulkan"])), &m).unwrap_err();
        assert!(
            err.to_string().starts_with("--backend vulkan: no GPU of this machine is driven by it (GPUs here are driven by CUDA"),
            "{err}"
        );
        m.other_backends = vec![crate::machine::OtherBackend {
            same_as: "CUDA0".into(),
            device: machine(&[("Vulkan0", "Vulkan", "gpu")]).devices[0].clone(),
        }];
        assert_eq!(backends_for(None, &m).unwrap(), ["CUDA", "Vulkan"]);
        assert_eq!(
            backends_for(Some(&asked(&["VULKAN", "cuda", "vulkan"])), &m).unwrap(),
            ["Vulkan", "CUDA"]
        );
    }
}
