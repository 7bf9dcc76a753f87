use super::*;

#[test]
fn every_knob_is_in_the_label_order_once_and_names_are_unique() {
    let mut names: Vec<&str> = KNOBS.iter().map(|k| k.name()).collect();
    names.sort();
    let mut order = LABEL_ORDER.to_vec();
    order.sort();
    assert_eq!(names, order);
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "two knobs share a name");
}

#[test]
fn each_default_reads_back_as_written_and_choices_parse() {
    let d = llama_defaults(4, 0);
    for k in KNOBS.iter() {
        if let Some(v) = k.default() {
            assert_eq!(k.value(&d), v, "{}", k.name());
            assert!(k.is_default(&d), "{}", k.name());
        }
        for choice in k.choices() {
            let mut c = d.clone();
            k.set(&mut c, choice).unwrap();
            assert_eq!(
                k.value(&c).split('/').next().unwrap(),
                choice,
                "{}",
                k.name()
            );
        }
    }
    assert_eq!(changed_from_defaults(&d), 0);
    assert!(!lossy(&d));
}

#[test]
fn defaults_are_llama_cpps() {
    let d = llama_defaults(8, 3);
    assert_eq!(
        label(&d),
        "ngl=3 t=8 b=2048/512 kv=f16/f16 fa=auto repack",
        "the label of llama.cpp's defaults"
    );
    assert_eq!(
        (d.n_batch, d.n_ubatch, d.threads, d.n_gpu_layers),
        (2048, 512, 8, 3)
    );
    assert!(environment_set(&d).is_empty());
    let env = environment(&d);
    assert!(env.contains(&("GGML_OP_OFFLOAD_MIN_BATCH", None)));
    assert!(env.contains(&("LLAMA_ATTN_ROT_DISABLE", None)));
}

#[test]
fn a_knob_set_away_from_its_default_shows_in_every_list() {
    let d = llama_defaults(4, 0);
    for k in KNOBS.iter() {
        let Some(value) = [k.choices(), vec!["7", "CUDA0", "3,1"]]
            .concat()
            .into_iter()
            .find(|v| {
                let mut c = d.clone();
                k.set(&mut c, v).is_ok() && !k.is_default(&c)
            })
        else {
            continue; // a machine-dependent default: every value is "not a change"
        };
        let mut c = d.clone();
        k.set(&mut c, value).unwrap();
        assert_eq!(changed_from_defaults(&c), 1, "{}", k.name());
        assert_ne!(label(&c), label(&d), "{} shows in the label", k.name());
        let passed = server_options(&c) != server_options(&d) || environment(&c) != environment(&d);
        assert!(passed, "{} reaches llama-server", k.name());
        assert_eq!(
            differing(&c, &d).map(|k| k.name()).collect::<Vec<_>>(),
            [k.name()]
        );
        k.reset(&mut c);
        assert_eq!(c, d, "{} resets to its default", k.name());
    }
}

#[test]
fn phases_of_a_difference() {
    let d = llama_defaults(4, 0);
    let tb = d.with_threads(4, 2);
    assert_eq!(phases_moved(&[d.clone(), tb.clone()]), Phases::PROMPT);
    let t = d.with_threads(2, 4);
    assert_eq!(phases_moved(&[d.clone(), t.clone()]), Phases::GENERATION);
    // -t without -tb moves both: the prompt's threads follow it.
    let both = d.with_threads(2, 2);
    assert_eq!(phases_moved(&[d.clone(), both]), Phases::BOTH);
    assert_eq!(
        phases_moved(&[d.clone(), d.with_ubatch(256)]),
        Phases::PROMPT
    );
    assert_eq!(phases_moved(&[d.clone(), tb, t]), Phases::BOTH);
    assert_eq!(phases_moved(&[d.clone(), d.clone()]), Phases::NONE);
}

#[test]
fn rotation_is_lossy_only_on_a_quantized_cache() {
    let mut c = llama_defaults(4, 0);
    AttnRotation.set(&mut c, "off").unwrap();
    assert!(!lossy(&c), "an f16 cache is never rotated");
    KvCache.set(&mut c, "q8_0/q8_0").unwrap();
    assert!(AttnRotation.lossy(&c));
    assert_eq!(
        environment_set(&c),
        [("LLAMA_ATTN_ROT_DISABLE", "1".to_string())]
    );
}

#[test]
fn the_model_key_holds_process_and_model_knobs_only() {
    let d = llama_defaults(4, 0);
    let mut ctx = d.with_ubatch(128);
    Flash.set(&mut ctx, "on").unwrap();
    assert_eq!(model_key(&d), model_key(&ctx));
    let mut proc = d.clone();
    OpOffloadMinBatch.set(&mut proc, "512").unwrap();
    assert_ne!(model_key(&d), model_key(&proc));
}

#[test]
fn a_counted_knobs_bounds_name_its_field_and_hold_its_default() {
    let d = llama_defaults(4, 1);
    assert_eq!(check_bounds(&d), Ok(()));
    let bounded: Vec<&dyn Knob> = KNOBS
        .iter()
        .copied()
        .filter(|k| k.bounds().is_some())
        .collect();
    assert!(bounded.iter().any(|k| k.name() == OpOffloadMinBatch.name()));
    for k in bounded {
        let b = k.bounds().unwrap();
        let mut c = d.clone();
        k.set(&mut c, &b.max.to_string()).unwrap();
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(
            json[b.field],
            b.max,
            "{}: its field is {}",
            k.name(),
            b.field
        );
        assert_eq!(check_bounds(&c), Ok(()), "{}", k.name());
        k.set(&mut c, &(b.max + 1).to_string()).unwrap();
        let err = check_bounds(&c).unwrap_err();
        assert_eq!((err.knob, err.value), (k.name(), b.max + 1));
    }
}

#[test]
fn the_environment_reads_back_as_the_knobs_that_set_it() {
    let d = llama_defaults(4, 0);
    for side in [Side::Process, Side::Context] {
        for k in KNOBS
            .iter()
            .filter(|k| k.side() == side && k.env(&d).is_some())
        {
            let values = [k.choices(), k.default().into_iter().collect(), vec!["64"]].concat();
            for v in values {
                let mut c = d.clone();
                if k.set(&mut c, v).is_err() {
                    continue;
                }
                let mut back = d.clone();
                set_from_environment(&mut back, side, &environment_of(&c, side));
                assert_eq!(k.value(&back), k.value(&c), "{} = {v}", k.name());
            }
        }
    }
    // A variable a run does not set leaves its knob at llama.cpp's default.
    let mut off = d.clone();
    AttnRotation.set(&mut off, "off").unwrap();
    set_from_environment(&mut off, Side::Context, &[]);
    assert_eq!(off, d);
}
