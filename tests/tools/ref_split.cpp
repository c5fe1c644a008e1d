// ref_split.cpp — llama.cpp's pre-tokenizer as a reference for tests/cli_pretok.sh.
//
// Built against llama.cpp's own src/unicode.cpp and src/unicode-data.cpp
// (taken from the peer source tarball at test time, not kept here), so the
// splits are exactly what llama.cpp's BPE tokenizer feeds its merges.
//
//   ref_split PATTERNS < TEXTS
// PATTERNS: one regex per line, hex-encoded (the sequence, in order).
// TEXTS: texts separated by a NUL byte. Output: one line per text, the
// pieces hex-encoded and joined by '|'.
#include "unicode.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

static std::string unhex(const std::string &h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out += (char)std::stoi(h.substr(i, 2), nullptr, 16);
    return out;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: ref_split PATTERNS < TEXTS\n"); return 2; }
    std::vector<std::string> pats;
    std::ifstream pf(argv[1]);
    for (std::string l; std::getline(pf, l);)
        if (!l.empty()) pats.push_back(unhex(l));
    std::string all((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    while (pos < all.size()) {
        size_t e = all.find('\0', pos);
        if (e == std::string::npos) e = all.size();
        // an empty text is not split: llama.cpp's hand-written splitters
        // (kimi-k2, afmoe) return no pieces for it, which unicode_regex_split
        // takes as "no custom splitter" and hands their names to std::regex
        // (which throws); its tokenizer never splits an empty fragment.
        // Empty pieces (superbpe's empty matches) make no token; they are left
        // out, as dspark leaves them out.
        const std::string text = all.substr(pos, e - pos);
        const auto words = text.empty() ? std::vector<std::string>() : unicode_regex_split(text, pats, false);
        bool first = true;
        for (size_t w = 0; w < words.size(); w++) {
            if (words[w].empty()) continue;
            if (!first) putchar('|');
            first = false;
            for (unsigned char c : words[w]) printf("%02x", c);
        }
        putchar('\n');
        pos = e + 1;
    }
    return 0;
}
