// Reference GPT-2 encoder for the tokenizer oracle test: the npm package gpt-3-encoder's own encode().
//   node encode_reference.js ENCODER_DIR encode FILE          -> ids of FILE (read as UTF-8), one line
//   node encode_reference.js ENCODER_DIR head FILE... N OUT   -> writes the concatenated FILEs cut to at
//                                                               most N bytes at a line end, to OUT
//   node encode_reference.js ENCODER_DIR fuzz SEED N OUT      -> writes N random code points (seeded,
//                  drawn from ASCII, whitespace incl. Unicode spaces, apostrophes/contraction letters,
//                  Latin-1, combining marks, CJK, Arabic, digits of several scripts, emoji, and a
//                  sweep of the BMP and astral planes) as UTF-8 to OUT
// ENCODER_DIR is third_party/node/node_modules/gpt-3-encoder (the package's directory).
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, cmd, ...rest] = process.argv.slice(2);
if (cmd === 'encode' && rest.length === 1) {
  const { encode } = require(path.resolve(dir));
  const text = fs.readFileSync(rest[0], 'utf-8');
  process.stdout.write(encode(text).join(' ') + '\n');
} else if (cmd === 'head' && rest.length >= 3) {
  const out = rest.pop();
  const n = parseInt(rest.pop(), 10);
  let buf = Buffer.concat(rest.map(f => fs.readFileSync(f)));
  if (buf.length > n) buf = buf.subarray(0, buf.lastIndexOf(0x0a, n - 1) + 1);
  fs.writeFileSync(out, buf);
} else if (cmd === 'fuzz' && rest.length === 3) {
  let state = (parseInt(rest[0], 10) >>> 0) || 1;
  const rnd = k => {  // xorshift32, uniform in [0, k)
    state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0;
    return state % k;
  };
  const pools = [
    'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789',
    ' ', '  \t\n\r\v\f', '\u00a0\u1680\u2000\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff\u0085\u200b\u180e',
    "'''stmdrevl", '.,;:!?-_()[]{}<>/\\|@#$%^&*+=~`"', 'éñüßøÅÇÐÞæœ¡¿«»©®°±µ¶·¼½¾×÷',
    '\u0301\u0308\u0303\u0327\u0351\u20dd', '你好世界日本語テキストカタカナ한국어', 'مرحبابالعالم٣٤٥', '१२३٠١²³①Ⅻ',
  ];
  const emoji = ['😀', '👍🏽', '👨‍👩‍👧', '🇩🇪', '❤️', '🚀', '𝔘𝔫𝔦', '𐍈', '𝟘𝟙'];
  const n = parseInt(rest[1], 10);
  let out = '';
  for (let i = 0; i < n; ++i) {
    const r = rnd(100);
    if (r < 85) {
      const pool = pools[rnd(pools.length)];
      out += pool[rnd(pool.length)];
    } else if (r < 92) {
      out += emoji[rnd(emoji.length)];
    } else {  // any assigned-or-not scalar value, skipping surrogates
      let cp = rnd(r < 98 ? 0x10000 : 0x110000);
      if (cp >= 0xd800 && cp < 0xe000) cp = 0x20;
      out += String.fromCodePoint(cp);
    }
  }
  fs.writeFileSync(rest[2], out, 'utf-8');
} else {
  process.stderr.write('usage: encode_reference.js ENCODER_DIR encode FILE | head FILE... N OUT | fuzz SEED N OUT\n');
  process.exit(2);
}
