//! Writes a GGUF file's tensors dequantized to F32 (or F16) with its metadata unchanged: the
//! "unquantized" source that `llama-quantize` and `kasoku quantize` both start from when no
//! unquantized checkpoint is at hand (bench/quant_quality.py).
//!
//! `cargo run --release -p kasoku --example dequantize_gguf -- IN.gguf OUT.gguf [f32|f16]`

use kasoku::format::{write_gguf, GgufFile, MetaValue, TensorSource};
use kasoku::quant::{dequantize, DType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        eprintln!("usage: dequantize_gguf IN.gguf OUT.gguf [f32|f16]");
        std::process::exit(2);
    };
    let to = match args.get(2).map(String::as_str) {
        None | Some("f32") => DType::F32,
        Some("f16") => DType::F16,
        Some(other) => {
            eprintln!("unknown type '{other}' (f32 or f16)");
            std::process::exit(2);
        }
    };
    let file = GgufFile::open(input).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let meta: Vec<(&String, MetaValue)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k.as_str() != "general.file_type")
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let mut tensors = Vec::new();
    for name in file.names() {
        let t = TensorSource::get(&file, &name).expect("listed");
        let mut values = vec![0f32; t.numel()];
        dequantize(t.dtype, t.data.as_slice(), &mut values);
        // Vectors (norms, biases) stay F32, as llama.cpp keeps them.
        let dtype = if t.shape.len() == 1 { DType::F32 } else { to };
        let bytes: Vec<u8> = match dtype {
            DType::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        tensors.push((name, dtype, t.shape.clone(), bytes));
    }
    write_gguf(output, &meta, &tensors).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    eprintln!("wrote {output}: {} tensors as {to}", tensors.len());
}
