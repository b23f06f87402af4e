// Summarise a GGUF file with Hugging Face's parser (@huggingface/gguf), as
// JSON on stdout: the independent view the end-to-end tests hold
// `moe inspect --json` to. usage: node gguf_summary.mjs FILE.gguf
import { gguf } from "@huggingface/gguf";
import { resolve } from "node:path";

const file = resolve(process.argv[2]);
const { metadata, tensorInfos, tensorDataOffset } = await gguf(file, { allowLocalFile: true });
const summary = {
  version: metadata.version,
  metadata_keys: Object.keys(metadata).filter((k) => !["version", "tensor_count", "kv_count"].includes(k)),
  architecture: metadata["general.architecture"],
  file_type: metadata["general.file_type"],
  data_offset: Number(tensorDataOffset),
  tensors: tensorInfos.map((t) => ({
    name: t.name,
    type: t.dtype,
    shape: t.shape.map(Number),
    offset: Number(t.offset),
  })),
};
process.stdout.write(JSON.stringify(summary) + "\n");
