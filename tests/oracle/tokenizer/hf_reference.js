#!/usr/bin/env node
// Reference runs of Hugging Face `tokenizers` (npm package `tokenizers`: the Rust library's Node bindings,
// installed by scripts/install_deps.sh under third_party/node).
//   hf_reference.js encode TOKENIZER_JSON TEXT_FILE          ids of the whole file (add_special_tokens = true)
//   hf_reference.js decode TOKENIZER_JSON IDS_FILE           text of whitespace-separated ids (special tokens kept)
//   hf_reference.js fuzz SEED N OUT_FILE                     N seeded random code points (scripts, spaces, emoji)
const fs = require('fs');
const path = require('path');
const nm = path.join(__dirname, '..', '..', '..', 'third_party', 'node', 'node_modules');
const { Tokenizer } = require(path.join(nm, 'tokenizers'));

function rng(seed) {  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Random text: mostly letters of many scripts and spaces, with digits, punctuation, odd whitespace, emoji.
function fuzz(seed, n) {
  const r = rng(seed);
  const ranges = [[0x61, 0x7a], [0x41, 0x5a], [0x30, 0x39], [0x21, 0x2f], [0xc0, 0x24f], [0x370, 0x3ff],
                  [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff],
                  [0x3040, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xad00], [0xff01, 0xff5e], [0x1f300, 0x1f64f],
                  [0x1f900, 0x1f9ff], [0x300, 0x36f], [0x2000, 0x206f], [0x10000, 0x1007f]];
  const spaces = [' ', ' ', ' ', ' ', '  ', '\n', '\n\n', '\t', '\r\n', '\u00a0', '\u3000', '\u000b', '\u0085',
                  '\u2028', '\ufeff', '\u200b', '\u001c', '\u180e'];
  const words = ["'s", "'S", "'ll", "'ve", "'re", "'d", "'m", "'t", "\u017f", "\u212a", "12345", "3.14159", "...", "e\u0301",
                 "\u1100\u1161", "\uff11\uff12\uff13", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", "<|", "|>",
                 "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<|begin_of_text|>", "<unk>", "[MASK]", "<mask>"];
  let out = '';
  for (let i = 0; i < n; ++i) {
    const x = r();
    if (x < 0.2) out += spaces[Math.floor(r() * spaces.length)];
    else if (x < 0.27) out += words[Math.floor(r() * words.length)];
    else {
      const [a, b] = ranges[Math.floor(r() * ranges.length)];
      out += String.fromCodePoint(a + Math.floor(r() * (b - a + 1)));
    }
  }
  return out;
}

(async () => {
  const [mode, a, b, c] = process.argv.slice(2);
  if (mode === 'fuzz') {
    fs.writeFileSync(c, fuzz(Number(a), Number(b)));
    return;
  }
  const tok = Tokenizer.fromFile(a);
  if (mode === 'encode') {
    const e = await tok.encode(fs.readFileSync(b, 'utf8'), null, { addSpecialTokens: true });
    process.stdout.write(e.getIds().join(' ') + '\n');
  } else if (mode === 'decode') {
    const ids = fs.readFileSync(b, 'utf8').split(/\s+/).filter((s) => s.length).map(Number);
    process.stdout.write(await tok.decode(ids, false));
  } else {
    console.error('usage: hf_reference.js encode|decode TOKENIZER_JSON FILE | fuzz SEED N OUT');
    process.exit(2);
  }
})().catch((e) => { console.error(String(e)); process.exit(1); });
