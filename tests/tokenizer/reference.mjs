// Encodes every string of a corpus with the JavaScript implementation of HF tokenizers
// (@lenml/tokenizers, a transformers.js fork, with the tokenizer.json bundled in
// @lenml/tokenizer-deepseek_v4) and prints the ids as JSON: one array per line, no BOS.
//
// Usage: node tests/tokenizer/reference.mjs NODE_DIR CORPUS_JSON > ids.json
//   NODE_DIR: where scripts/fetch-tokenizer.sh installed the packages (DEST_DIR/node).
//   CORPUS_JSON: a JSON array of strings.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [nodeDir, corpusPath] = process.argv.slice(2);
if (!nodeDir || !corpusPath) {
  console.error("usage: node reference.mjs NODE_DIR CORPUS_JSON");
  process.exit(2);
}
const require = createRequire(path.resolve(nodeDir, "package.json"));
const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v4");
const tok = fromPreTrained();
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const lines = corpus.map((text) => JSON.stringify(tok.encode(text, { add_special_tokens: false })));
process.stdout.write("[\n" + lines.join(",\n") + "\n]\n");
