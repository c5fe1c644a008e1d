/* tokenizer_pre.c — the byte-level BPE pre-tokenizers (tokenizer.ggml.pre),
 * as llama.cpp defines them, run with PCRE2.
 *
 * A pre-tokenizer is a sequence of regexes. As in llama.cpp, the first splits
 * the text into pieces (the matches, and the stretches between them), each
 * next one splits every piece again, within that piece alone (a look-ahead
 * at a piece's end sees the end of the subject, `$` matches only there).
 * The patterns are the Hugging Face tokenizer.json ones in the spelling
 * llama.cpp uses; the table below says which tokenizer.ggml.pre names share
 * a sequence.
 *
 * Character classes follow llama.cpp's definitions rather than PCRE2's own:
 *   - whitespace is Unicode's White_Space set (25 code points). Every
 *     non-ASCII member is replaced by \v (U+000B) in the subject before
 *     matching, as llama.cpp does, and the regexes are compiled without
 *     PCRE2_UCP, so \s is the ASCII set plus those stand-ins: a range such
 *     as deepseek-llm's "　-。" then does not match U+3000, exactly as there;
 *   - \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm}, \p{Lo} mean any letter (\p{L}):
 *     llama.cpp collapses each letter to one class before matching;
 *   - \p{L}, \p{N}, \p{P}, \p{S}, \p{M} are Unicode's general categories
 *     (PCRE2's tables; llama.cpp's are generated from the same data, so
 *     only code points assigned in one Unicode version and not the other
 *     can differ).
 * Case-insensitive contractions are spelled as explicit ASCII classes
 * ('[sS]'), as llama.cpp does (PCRE2's caseless matching would also fold
 * U+017F 'ſ' and U+212A 'K').
 *
 * Invalid UTF-8 never fails: the text is cut into maximal well-formed runs,
 * the regexes run on each run, and every byte that is not part of a
 * well-formed sequence is a pre-token of its own (llama.cpp replaces such a
 * byte with U+FFFD first; dspark keeps the byte, so that detokenize(tokenize(s))
 * == s for every byte string). */
#include "tokenizer_internal.h"

#include <stdlib.h>

/* ======================================================================
 * the regex sequences
 * ====================================================================== */

#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* Llama 3: numbers in groups of up to three digits */
#define RX_LLAMA3 RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2: the Llama 3 pattern with every digit its own pre-token */
#define RX_QWEN2 RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *const SEQ_LLAMA3[] = { RX_LLAMA3, NULL };
static const char *const SEQ_JAIS2[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    NULL,
};
static const char *const SEQ_DEEPSEEK_LLM[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
    NULL,
};
static const char *const SEQ_DEEPSEEK3[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_SPARK2_5[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
    NULL,
};
static const char *const SEQ_YOUTU[] = {
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_DEEPSEEK_CODER[] = {
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
    NULL,
};
static const char *const SEQ_FALCON[] = { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL };
static const char *const SEQ_STARCODER[] = { "\\p{N}", RX_GPT2, NULL };
static const char *const SEQ_GPT2[] = { RX_GPT2, NULL };
static const char *const SEQ_QWEN2[] = { RX_QWEN2, NULL };
static const char *const SEQ_QWEN35[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_PORO[] = { " ?[^(\\s|.,!?…。，、।۔،)]+", NULL };
static const char *const SEQ_VIKING[] = { " ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}", NULL };
static const char *const SEQ_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_CHAMELEON[] = {
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    RX_GPT2,
    NULL,
};
static const char *const SEQ_GPT4O[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_GRANITE_EMB_MULTI[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_BAILINGMOE[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_SEED_CODER[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_UFAKZEKA[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_LAGUNA[] = { "[^\\n]+|[\\n]+", RX_QWEN2, NULL };
static const char *const SEQ_EXAONE_MOE[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_MINICPM5[] = {
    "\\p{N}{1,3}",
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
/* The digit splitter llama.cpp writes as a name its own code implements (not
 * a regex it compiles): every maximal run of \p{N} is cut into groups of
 * three from the right, the leading group of one or two when the run's
 * length is not a multiple of three — and that first group keeps the text
 * between the previous run and this one in front of it ("a1234" -> "a1",
 * "234"), as llama.cpp's code emits it. afmoe names it; tiny_aya's
 * tokenizer.json regex "\d{1,3}(?=(?:\d{3})*\b)" is routed to the same
 * code there, so it groups every \p{N}, not only ASCII digits. dspark runs
 * it as split_digit_groups below. */
#define NAME_AFMOE_DIGITS "\\p{AFMoE_digits}"
#define NAME_TINY_AYA_DIGITS "\\d{1,3}(?=(?:\\d{3})*\\b)"
#define NAME_KIMI_K2 "\\p{Han}+"
static const char *const SEQ_KIMI_K2[] = { NAME_KIMI_K2, NULL };
static const char *const SEQ_AFMOE[] = {
    NAME_AFMOE_DIGITS,
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
static const char *const SEQ_TINY_AYA[] = {
    NAME_TINY_AYA_DIGITS,
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RX_CONTRACTIONS "?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RX_CONTRACTIONS "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL,
};
/* superbpe: number runs, then a split (an empty match: a boundary, no piece)
 * before every group of three ASCII digits that ends a run */
static const char *const SEQ_SUPERBPE[] = { "\\p{N}+", "(?=(\\d{3})+(?!\\d))", NULL };
/* BPE over raw UTF-8 (sarvam-moe, gemma4): only newline runs are split off */
static const char *const SEQ_NEWLINES[] = { "[^\\n]+|[\\n]+", NULL };
static const char *const SEQ_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    RX_GPT2,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
    NULL,
};

/* One entry per distinct sequence; indexed by ds_pre_kind. */
static const char *const *const SEQ_OF[DS_PRE_COUNT] = {
    [DS_PRE_GPT2] = SEQ_GPT2,           [DS_PRE_LLAMA3] = SEQ_LLAMA3,
    [DS_PRE_QWEN2] = SEQ_QWEN2,         [DS_PRE_DEFAULT] = SEQ_DEFAULT,
    [DS_PRE_QWEN35] = SEQ_QWEN35,       [DS_PRE_DEEPSEEK_LLM] = SEQ_DEEPSEEK_LLM,
    [DS_PRE_DEEPSEEK_CODER] = SEQ_DEEPSEEK_CODER, [DS_PRE_DEEPSEEK3] = SEQ_DEEPSEEK3,
    [DS_PRE_FALCON] = SEQ_FALCON,       [DS_PRE_STARCODER] = SEQ_STARCODER,
    [DS_PRE_JAIS2] = SEQ_JAIS2,         [DS_PRE_SPARK2_5] = SEQ_SPARK2_5,
    [DS_PRE_YOUTU] = SEQ_YOUTU,         [DS_PRE_PORO] = SEQ_PORO,
    [DS_PRE_VIKING] = SEQ_VIKING,       [DS_PRE_TEKKEN] = SEQ_TEKKEN,
    [DS_PRE_CHAMELEON] = SEQ_CHAMELEON, [DS_PRE_GPT4O] = SEQ_GPT4O,
    [DS_PRE_GRANITE_EMB_MULTI] = SEQ_GRANITE_EMB_MULTI, [DS_PRE_BAILINGMOE] = SEQ_BAILINGMOE,
    [DS_PRE_SEED_CODER] = SEQ_SEED_CODER, [DS_PRE_UFAKZEKA] = SEQ_UFAKZEKA,
    [DS_PRE_LAGUNA] = SEQ_LAGUNA,       [DS_PRE_EXAONE_MOE] = SEQ_EXAONE_MOE,
    [DS_PRE_MINICPM5] = SEQ_MINICPM5,   [DS_PRE_KIMI_K2] = SEQ_KIMI_K2,
    [DS_PRE_AFMOE] = SEQ_AFMOE,         [DS_PRE_TINY_AYA] = SEQ_TINY_AYA,
    [DS_PRE_SUPERBPE] = SEQ_SUPERBPE,   [DS_PRE_NEWLINES] = SEQ_NEWLINES,
};

/* What dspark compiles for a pattern llama.cpp spells as a name of its own
 * hand-written splitter; every other pattern is compiled as written.
 *   Han (Kimi K2): the code points llama.cpp's unicode_cpt_is_han counts
 *   (CJK unified ideographs and extensions A..F, compatibility ideographs
 *   and their supplement) — not PCRE2's \p{Han} script, which also holds
 *   radicals, U+3005 and others. A "letter other than Han" is [^\P{L}HAN]. */
#define HAN "\\x{3400}-\\x{4DBF}\\x{4E00}-\\x{9FFF}\\x{F900}-\\x{FAFF}\\x{20000}-\\x{2A6DF}" \
    "\\x{2A700}-\\x{2EBEF}\\x{2F800}-\\x{2FA1F}"
static int is_digit_groups(const char *pat) {
    return !strcmp(pat, NAME_AFMOE_DIGITS) || !strcmp(pat, NAME_TINY_AYA_DIGITS);
}
static const char *pcre_spelling(const char *pat) {
    if (is_digit_groups(pat)) return "\\p{N}+";       /* finds the runs split_digit_groups cuts */
    if (!strcmp(pat, NAME_KIMI_K2))
        return "[" HAN "]+|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}" HAN "]+(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
               "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    return pat;
}

/* ======================================================================
 * tokenizer.ggml.pre names
 *
 * Every name llama.cpp accepts for a byte-level BPE vocabulary, with its
 * sequence and llama.cpp's per-name settings: ignore_merges (a pre-token
 * that is itself a token is emitted whole) and add_bos (the default of
 * tokenizer.ggml.add_bos_token when the file does not set it). "gpt2" is
 * dspark's own older spelling of "gpt-2".
 * ====================================================================== */

typedef struct { const char *name; ds_pre_kind kind; uint8_t ignore_merges, add_bos; } pre_name;

static const pre_name PRE_NAMES[] = {
    { "default", DS_PRE_DEFAULT, 0, 0 },
    { "gpt2", DS_PRE_GPT2, 0, 0 },
    { "gpt-2", DS_PRE_GPT2, 0, 0 }, { "phi-2", DS_PRE_GPT2, 0, 0 }, { "jina-es", DS_PRE_GPT2, 0, 0 },
    { "jina-de", DS_PRE_GPT2, 0, 0 }, { "gigachat", DS_PRE_GPT2, 0, 0 }, { "jina-v2-es", DS_PRE_GPT2, 0, 0 },
    { "jina-v2-de", DS_PRE_GPT2, 0, 0 }, { "a.x-4.0", DS_PRE_GPT2, 0, 0 }, { "mellum", DS_PRE_GPT2, 0, 0 },
    { "modern-bert", DS_PRE_GPT2, 0, 0 }, { "jina-v1-en", DS_PRE_GPT2, 0, 0 },
    { "jina-v2-code", DS_PRE_GPT2, 0, 0 }, { "roberta-bpe", DS_PRE_GPT2, 0, 0 }, { "mpt", DS_PRE_GPT2, 0, 0 },
    { "olmo", DS_PRE_GPT2, 0, 0 }, { "jais", DS_PRE_GPT2, 0, 0 }, { "exaone4", DS_PRE_GPT2, 0, 0 },
    { "trillion", DS_PRE_GPT2, 0, 0 }, { "granite-docling", DS_PRE_GPT2, 0, 0 },
    { "llama3", DS_PRE_LLAMA3, 1, 1 }, { "llama-v3", DS_PRE_LLAMA3, 1, 1 }, { "llama-bpe", DS_PRE_LLAMA3, 1, 1 },
    { "falcon3", DS_PRE_LLAMA3, 1, 1 }, { "falcon-h1", DS_PRE_LLAMA3, 1, 1 }, { "pixtral", DS_PRE_LLAMA3, 1, 1 },
    { "midm-2.0", DS_PRE_LLAMA3, 1, 1 }, { "lfm2", DS_PRE_LLAMA3, 1, 1 }, { "jina-v5-nano", DS_PRE_LLAMA3, 1, 1 },
    { "dbrx", DS_PRE_LLAMA3, 0, 0 }, { "smaug-bpe", DS_PRE_LLAMA3, 0, 0 }, { "glm4", DS_PRE_LLAMA3, 0, 0 },
    { "chatglm-bpe", DS_PRE_LLAMA3, 0, 0 },
    { "qwen2", DS_PRE_QWEN2, 0, 0 }, { "deepseek-r1-qwen", DS_PRE_QWEN2, 0, 0 }, { "kormo", DS_PRE_QWEN2, 0, 0 },
    { "f2llmv2", DS_PRE_QWEN2, 0, 0 }, { "stablelm2", DS_PRE_QWEN2, 0, 0 }, { "megrez", DS_PRE_QWEN2, 0, 0 },
    { "hunyuan", DS_PRE_QWEN2, 0, 0 }, { "grok-2", DS_PRE_QWEN2, 0, 0 }, { "solar-open", DS_PRE_QWEN2, 0, 0 },
    { "qwen35", DS_PRE_QWEN35, 0, 0 },
    { "deepseek-llm", DS_PRE_DEEPSEEK_LLM, 0, 0 },
    { "deepseek-coder", DS_PRE_DEEPSEEK_CODER, 0, 0 },
    { "deepseek-v3", DS_PRE_DEEPSEEK3, 0, 0 }, { "hunyuan-dense", DS_PRE_DEEPSEEK3, 0, 0 },
    { "hy_v4", DS_PRE_DEEPSEEK3, 0, 0 }, { "joyai-llm", DS_PRE_DEEPSEEK3, 0, 0 },
    { "falcon", DS_PRE_FALCON, 0, 0 },
    { "starcoder", DS_PRE_STARCODER, 0, 0 }, { "refact", DS_PRE_STARCODER, 0, 0 },
    { "command-r", DS_PRE_STARCODER, 0, 0 }, { "smollm", DS_PRE_STARCODER, 0, 0 },
    { "codeshell", DS_PRE_STARCODER, 0, 0 }, { "exaone", DS_PRE_STARCODER, 0, 0 },
    { "minerva-7b", DS_PRE_STARCODER, 0, 0 }, { "mellum2", DS_PRE_STARCODER, 0, 0 },
    { "jais-2", DS_PRE_JAIS2, 0, 0 },
    { "spark2_5", DS_PRE_SPARK2_5, 0, 0 },
    { "youtu", DS_PRE_YOUTU, 1, 0 },
    { "poro-chat", DS_PRE_PORO, 0, 0 }, { "bloom", DS_PRE_PORO, 0, 0 }, { "gpt3-finnish", DS_PRE_PORO, 0, 0 },
    { "viking", DS_PRE_VIKING, 0, 0 },
    { "tekken", DS_PRE_TEKKEN, 1, 1 },
    { "chameleon", DS_PRE_CHAMELEON, 0, 1 },
    { "gpt-4o", DS_PRE_GPT4O, 0, 0 }, { "llama4", DS_PRE_GPT4O, 0, 0 }, { "kanana2", DS_PRE_GPT4O, 0, 0 },
    { "talkie", DS_PRE_GPT4O, 0, 0 }, { "minimax-m2", DS_PRE_GPT4O, 0, 0 },
    { "granite-embed-multi-97m", DS_PRE_GRANITE_EMB_MULTI, 1, 0 },
    { "bailingmoe", DS_PRE_BAILINGMOE, 0, 0 }, { "bailingmoe2", DS_PRE_BAILINGMOE, 0, 0 },
    { "llada-moe", DS_PRE_BAILINGMOE, 0, 0 },
    { "seed-coder", DS_PRE_SEED_CODER, 0, 0 },
    { "ufakzeka", DS_PRE_UFAKZEKA, 0, 0 },
    { "laguna", DS_PRE_LAGUNA, 0, 0 },
    { "exaone-moe", DS_PRE_EXAONE_MOE, 0, 0 },
    { "minicpm5", DS_PRE_MINICPM5, 1, 0 },
    { "kimi-k2", DS_PRE_KIMI_K2, 0, 0 },
    { "afmoe", DS_PRE_AFMOE, 0, 0 },
    { "tiny_aya", DS_PRE_TINY_AYA, 0, 0 }, { "cohere2moe", DS_PRE_TINY_AYA, 0, 0 },
    { "superbpe", DS_PRE_SUPERBPE, 0, 0 },
    /* BPE over raw UTF-8 (the tokenizer reads them so: ds_pre_is_raw);
     * llama.cpp turns add_bos_token on for gemma4 whatever the file says */
    { "sarvam-moe", DS_PRE_NEWLINES, 0, 0 }, { "gemma4", DS_PRE_NEWLINES, 0, 1 },
    { "granite-embed-multi-311m", DS_PRE_NEWLINES, 0, 1 },
};

/* Names llama.cpp knows that dspark does not implement: "whitespace"
 * (jina-v2-zh: \S+ pieces over raw UTF-8, also a tokenizer model of its own
 * there), refused with its own line. */
static const char *const PRE_REFUSED[] = { "whitespace" };

int ds_pre_is_raw(const char *name) {
    return name && (!strcmp(name, "sarvam-moe") || !strcmp(name, "gemma4") ||
                    !strcmp(name, "granite-embed-multi-311m"));
}

int ds_pre_lookup(const char *name, ds_pre_kind *kind, int *ignore_merges, int *add_bos) {
    if (!name) name = "default";            /* llama.cpp: a file without the key */
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof PRE_NAMES[0]; i++) {
        if (strcmp(name, PRE_NAMES[i].name)) continue;
        *kind = PRE_NAMES[i].kind;
        if (ignore_merges) *ignore_merges = PRE_NAMES[i].ignore_merges;
        if (add_bos) *add_bos = PRE_NAMES[i].add_bos;
        return 0;
    }
    for (size_t i = 0; i < sizeof PRE_REFUSED / sizeof PRE_REFUSED[0]; i++)
        if (!strcmp(name, PRE_REFUSED[i])) return -2;
    return -1;
}

int ds_pre_kind_from_name(const char *name, ds_pre_kind *out) {
    return ds_pre_lookup(name, out, NULL, NULL) ? -1 : 0;
}

size_t ds_pre_names(const char **names, size_t cap) {
    size_t n = sizeof PRE_NAMES / sizeof PRE_NAMES[0];
    for (size_t i = 0; i < n && i < cap; i++) names[i] = PRE_NAMES[i].name;
    return n;
}

const char *const *ds_pre_patterns(ds_pre_kind kind) {
    return (unsigned)kind < DS_PRE_COUNT ? SEQ_OF[kind] : NULL;
}

/* ======================================================================
 * compiling
 * ====================================================================== */

/* llama.cpp reads \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo} as "a letter"; rewrite
 * them to \p{L} so PCRE2 does the same. */
static char *letters_collapsed(const char *pat) {
    size_t n = strlen(pat);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + 6 <= n && pat[i] == '\\' && pat[i + 1] == 'p' && pat[i + 2] == '{' && pat[i + 3] == 'L' &&
            pat[i + 5] == '}' && strchr("ultmo", pat[i + 4])) {
            memcpy(out + o, "\\p{L}", 5);
            o += 5;
            i += 6;
        } else {
            out[o++] = pat[i++];
        }
    }
    out[o] = 0;
    return out;
}

int ds_pretok_init(ds_pretok *p, ds_pre_kind kind, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    const char *const *seq = ds_pre_patterns(kind);
    if (!seq) { ds_errf(err, errlen, "unknown pre-tokenizer kind %d", (int)kind); return -1; }
    p->jit = 1;
    for (int k = 0; seq[k]; k++) {
        if (k == DS_PRETOK_MAX) { ds_errf(err, errlen, "pre-tokenizer has too many regexes"); goto fail; }
        char *pat = letters_collapsed(pcre_spelling(seq[k]));
        if (!pat) { ds_errf(err, errlen, "out of memory compiling the pre-tokenizer"); goto fail; }
        int ec;
        PCRE2_SIZE eo;
        /* no PCRE2_UCP: \s is ASCII's plus the \v stand-ins (see the top) */
        p->re[k] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY,
                                 &ec, &eo, NULL);
        free(pat);
        if (!p->re[k]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            ds_errf(err, errlen, "pre-tokenizer regex %d does not compile at offset %zu: %s", k, (size_t)eo,
                    (const char *)msg);
            goto fail;
        }
        p->digit_groups[k] = (uint8_t)is_digit_groups(seq[k]);
        p->n_re = k + 1;
        /* JIT is an optimisation only: without it the interpreter gives the
         * same matches, so a failure (no JIT on this CPU/build) is ignored */
        if (pcre2_jit_compile(p->re[k], PCRE2_JIT_COMPLETE) != 0) p->jit = 0;
    }
    return 0;
fail:
    ds_pretok_free(p);
    return -1;
}

void ds_pretok_free(ds_pretok *p) {
    for (int k = 0; k < DS_PRETOK_MAX; k++)
        if (p->re[k]) pcre2_code_free(p->re[k]);
    memset(p, 0, sizeof *p);
}

/* ======================================================================
 * splitting
 * ====================================================================== */

/* One pcre2_match; on a JIT stack overflow (only pathological inputs can
 * need more than the default 32 KiB) retry once with a large private stack. */
static int pretok_match(const pcre2_code *re, const char *s, size_t n, size_t start, uint32_t opts,
                        pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | opts, md, NULL);
    if (rc != PCRE2_ERROR_JIT_STACKLIMIT) return rc;
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
    if (mc && js) {
        pcre2_jit_stack_assign(mc, NULL, js);
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | opts, md, mc);
    }
    if (js) pcre2_jit_stack_free(js);
    if (mc) pcre2_match_context_free(mc);
    return rc;
}

/* A PCRE2 resource error (match or depth limit, out of memory) as one line. */
static int match_failed(int rc, char *err, size_t errlen) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    ds_errf(err, errlen, "pre-tokenizer regex failed: %s", (const char *)msg);
    return -1;
}

/* pieces as (start, length) pairs in one growable array */
typedef struct { size_t *v; size_t n, cap; } piece_vec;

static int piece_push(piece_vec *a, size_t start, size_t len) {
    if (a->n + 2 > a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        size_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = start;
    a->v[a->n++] = len;
    return 0;
}

/* Split s[off, off + n) with one regex into the matches and the stretches
 * between them, appended to out.
 *
 * An empty match (superbpe's look-ahead is nothing else) is a boundary and no
 * piece. The search then goes on as C++'s std::regex_iterator does, which is
 * what llama.cpp runs such a regex with: first a non-empty match anchored at
 * the same place, and if there is none, an ordinary search one code point
 * further on. (PCRE2 runs anchored searches in its interpreter, not the JIT:
 * the same matches, a little slower, and only after an empty match.) */
static int split_one(const pcre2_code *re, const char *s, size_t off, size_t n, pcre2_match_data *md,
                     piece_vec *out, char *err, size_t errlen) {
    const char *sub = s + off;
    size_t pos = 0, last = 0;       /* search start; end of what is emitted */
    uint32_t opts = 0;
    while (pos <= n) {
        int rc = pretok_match(re, sub, n, pos, opts, md);
        if (rc == PCRE2_ERROR_NOMATCH) {
            if (!opts || pos >= n) break;
            opts = 0;
            pos += ds_utf8_valid_len((const uint8_t *)sub + pos, n - pos);
            continue;
        }
        if (rc < 0) return match_failed(rc, err, errlen);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms > last && piece_push(out, off + last, ms - last)) return -1;
        if (me > ms && piece_push(out, off + ms, me - ms)) return -1;
        last = me;
        pos = me;
        opts = me == ms ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
        if (!opts && pos >= n) break;
    }
    if (last < n && piece_push(out, off + last, n - last)) return -1;
    return 0;
}

/* afmoe / tiny_aya's digit groups (see NAME_AFMOE_DIGITS): re finds the
 * \p{N} runs of s[off, off + n); each run is cut in threes from the right,
 * its first group taking the stretch before it along. */
static int split_digit_groups(const pcre2_code *re, const char *s, size_t off, size_t n, pcre2_match_data *md,
                              piece_vec *out, char *err, size_t errlen) {
    const char *sub = s + off;
    size_t pos = 0, last = 0;
    while (pos < n) {
        int rc = pretok_match(re, sub, n, pos, 0, md);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return match_failed(rc, err, errlen);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t rs = ov[0], re_end = ov[1], n_cp = 0;
        for (size_t i = rs; i < re_end; n_cp++) i += ds_utf8_valid_len((const uint8_t *)sub + i, re_end - i);
        size_t group = n_cp % 3 ? n_cp % 3 : 3;
        for (size_t i = rs; i < re_end; group = 3) {
            for (size_t c = 0; c < group; c++) i += ds_utf8_valid_len((const uint8_t *)sub + i, re_end - i);
            if (piece_push(out, off + last, i - last)) return -1;
            last = i;
        }
        pos = re_end;
    }
    if (last < n && piece_push(out, off + last, n - last)) return -1;
    return 0;
}

static int split_step(const ds_pretok *p, int k, const char *s, size_t off, size_t n, pcre2_match_data *md,
                      piece_vec *out, char *err, size_t errlen) {
    return p->digit_groups[k] ? split_digit_groups(p->re[k], s, off, n, md, out, err, errlen)
                              : split_one(p->re[k], s, off, n, md, out, err, errlen);
}

/* Length of the non-ASCII White_Space code point at s (well-formed UTF-8,
 * n bytes left), or 0: U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000. */
static size_t nonascii_space_len(const uint8_t *s, size_t n) {
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    if (s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;                        /* U+1680 */
    if (s[0] == 0xe2 && s[1] == 0x80 && (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;                                                                     /* U+2000.. */
    if (s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;                        /* U+205F */
    if (s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;                        /* U+3000 */
    return 0;
}

/* Split one well-formed UTF-8 run s[0, n) with the whole sequence. */
static int pretok_split_run(const ds_pretok *p, const char *s, size_t n, pcre2_match_data *md,
                            piece_vec pv[2], ds_pretok_emit emit, void *ctx, char *err, size_t errlen) {
    /* the subject: s itself, or s with every non-ASCII space replaced by
     * \v, with omap[i] = the offset in s of subject byte i */
    const char *subj = s;
    size_t sn = n;
    char *tmp = NULL;
    size_t *omap = NULL;
    int rc = -1, has_space = 0;
    for (size_t i = 0; i < n && !has_space;) {
        if ((uint8_t)s[i] < 0x80) { i++; continue; }
        has_space = nonascii_space_len((const uint8_t *)s + i, n - i) != 0;
        i += ds_utf8_valid_len((const uint8_t *)s + i, n - i);
    }
    if (has_space) {
        tmp = malloc(n);
        omap = malloc((n + 1) * sizeof *omap);
        if (!tmp || !omap) { ds_errf(err, errlen, "out of memory while tokenizing"); goto done; }
        sn = 0;
        for (size_t i = 0; i < n;) {
            size_t l = nonascii_space_len((const uint8_t *)s + i, n - i);
            omap[sn] = i;
            tmp[sn++] = l ? '\v' : s[i];
            i += l ? l : 1;
        }
        omap[sn] = n;
        subj = tmp;
    }
    pv[0].n = 0;
    if (split_step(p, 0, subj, 0, sn, md, &pv[0], err, errlen)) goto done;
    int cur = 0;
    for (int k = 1; k < p->n_re; k++) {
        piece_vec *in = &pv[cur], *out = &pv[cur ^ 1];
        out->n = 0;
        for (size_t j = 0; j < in->n; j += 2)
            if (split_step(p, k, subj, in->v[j], in->v[j + 1], md, out, err, errlen)) goto done;
        cur ^= 1;
    }
    for (size_t j = 0; j < pv[cur].n; j += 2) {
        size_t a = pv[cur].v[j], b = a + pv[cur].v[j + 1];
        if (omap) { a = omap[a]; b = omap[b]; }
        if (emit(ctx, s + a, b - a)) goto done;
    }
    rc = 0;
done:
    free(tmp);
    free(omap);
    return rc;
}

int ds_pretok_split(const ds_pretok *p, const char *text, size_t len, ds_pretok_emit emit, void *ctx,
                    char *err, size_t errlen) {
    /* only the whole match is read (a pattern with groups returns 0: "ovector
     * too small", which is a match) */
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    piece_vec pv[2] = {{0}};
    if (!md) { ds_errf(err, errlen, "out of memory (pcre2 match data)"); return -1; }
    const uint8_t *u = (const uint8_t *)text;
    size_t i = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        if (!ds_utf8_valid_len(u + i, len - i)) {       /* an invalid byte is its own piece */
            rc = emit(ctx, text + i, 1);
            i++;
            continue;
        }
        size_t j = i, l;
        while (j < len && (l = ds_utf8_valid_len(u + j, len - j))) j += l;
        rc = pretok_split_run(p, text + i, j - i, md, pv, emit, ctx, err, errlen);
        i = j;
    }
    pcre2_match_data_free(md);
    free(pv[0].v);
    free(pv[1].v);
    if (rc && err && errlen && !err[0]) ds_errf(err, errlen, "pre-tokenizer callback failed");
    return rc ? -1 : 0;
}
