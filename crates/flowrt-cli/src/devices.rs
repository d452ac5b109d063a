//! `flowrt devices`: what each backend can run on here.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use flowrt_backends::{is_real_gpu, Devices};

#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn devices(args: DevicesArgs) -> Result<ExitCode> {
    let d = flowrt_backends::devices();
    if args.json {
        println!("{}", to_json(&d));
    } else {
        print(&d);
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(d: &Devices) -> serde_json::Value {
    let (list, error) = match &d.vulkan {
        Ok(list) => (list.as_slice(), None),
        Err(e) => (&[][..], Some(e.as_str())),
    };
    let vulkan: Vec<_> = list
        .iter()
        .map(|v| {
            serde_json::json!({
                "index": v.index,
                "name": v.name,
                "kind": v.kind,
                "driver": v.driver,
                "vendor_id": v.vendor_id,
                "device_id": v.device_id,
                "gpu": is_real_gpu(v),
            })
        })
        .collect();
    serde_json::json!({
        "cpu": {
            "index": 0,
            "name": d.cpu.name,
            "threads": d.cpu.threads,
            "kernels": d.cpu.kernels,
            "kernel_sets": d.cpu.kernel_sets,
            "features": d.cpu.features,
        },
        "vulkan": {
            "devices": vulkan,
            "error": error,
        },
        "auto": d.auto().name(),
    })
}

fn print(d: &Devices) {
    let c = &d.cpu;
    println!("cpu (--backend cpu)");
    println!("  0  {}", c.name);
    println!(
        "     {} threads by default; kernels {} (this host runs: {}); features: {}",
        c.threads,
        c.kernels,
        c.kernel_sets.join(" "),
        if c.features.is_empty() {
            "none".to_string()
        } else {
            c.features.join(" ")
        }
    );
    println!("vulkan (--backend vulkan --device N; the Vulkan backend is still being built)");
    match &d.vulkan {
        Ok(list) => {
            for v in list {
                println!("  {}  {} [{}]", v.index, v.name, v.kind);
                println!(
                    "     driver {}; vendor 0x{:04x}, device 0x{:04x}",
                    v.driver, v.vendor_id, v.device_id
                );
            }
            if !list.iter().any(is_real_gpu) {
                println!(
                    "  (no real GPU: every device above is a software renderer or of unknown kind)"
                );
            }
        }
        Err(why) => println!("  no device: {why}"),
    }
    println!(
        "--backend auto picks: {} (vulkan when some device is a discrete or integrated GPU)",
        d.auto()
    );
}
