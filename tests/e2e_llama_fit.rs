//! `autotune fit`: llama.cpp's own fit routine under an RPC budget (a real second device, a local
//! `autotune rpc-serve`) returns a placement, its llama-server flags, and autotune's prediction of it.

mod common;
use common::*;

#[test]
fn llama_fit_places_part_of_the_demo_model_on_a_small_rpc_device() {
    let model = demo_model();
    let server = rpc_server();
    let sb = Sandbox::new();
    let rpc = server.endpoint();
    // What every layer on RPC0 needs at ctx 1024, by the fit's own placement with room to spare
    // (272 MiB here). Most of it does not shrink with the layers (the output layer and the compute
    // buffer: 3 layers need 195 MiB): a budget of 85% of it holds only some of the 19.
    let (ngl, all_on_rpc0) = fit_on_rpc0(&sb, &model, &rpc, "1024");
    assert_eq!(ngl, 19);
    let budget: u64 = all_on_rpc0 * 85 / 100;
    let o = sb.run(&[
        "fit",
        model.to_str().unwrap(),
        "--json",
        "--rpc",
        &rpc,
        "--mem-budget",
        &format!("RPC0={budget}"),
        "--ctx",
        "1024",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["status"], "success", "{r:#}");
    assert_eq!(r["n_ctx"], 1024);
    let ngl = r["n_gpu_layers"].as_u64().unwrap();
    assert!(ngl > 0 && ngl < 19, "part of the model offloaded: {r:#}");
    // The fit was told to leave free − budget free on RPC0.
    let dev = &r["fit"]["devices"][0];
    assert_eq!(dev["name"], "RPC0");
    assert_eq!(dev["budget"].as_u64().unwrap(), budget);
    assert_eq!(
        dev["margin"].as_u64().unwrap(),
        dev["free"].as_u64().unwrap() - budget
    );
    assert!(r["fit"]["tensor_split"].is_array() && r["fit"]["overrides"].is_array());
    let args: Vec<&str> = r["server_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let ngl_s = ngl.to_string();
    assert!(
        args.windows(2).any(|w| w == ["-ngl", ngl_s.as_str()]),
        "{args:?}"
    );
    assert!(
        args.windows(2).any(|w| w == ["--rpc", rpc.as_str()]),
        "{args:?}"
    );
    // autotune's dry run of that placement: something on RPC0, within its budget.
    let rpc0 = r["predicted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == "RPC0")
        .unwrap_or_else(|| panic!("no RPC0 prediction: {r:#}"));
    let bytes = rpc0["predicted_bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes <= budget, "{rpc0}");
    assert_eq!(rpc0["within_budget"], true);
    assert_eq!(r["memory_safe"], true);
}
