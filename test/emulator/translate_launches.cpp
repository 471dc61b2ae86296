// translate_launches.cpp: turns a .cu file into plain C++ for the CPU emulation of CUDA
// (cuda_emulator.h). The only CUDA syntax a C++ compiler cannot parse is the launch,
//
//   kernel<T, 4><<<blocks, threads, 0, stream>>>(a, b, c);
//
// which becomes
//
//   mf::emulator::launch(stream, dim3(blocks), dim3(threads), [=] { kernel<T, 4>(a, b, c); });
//
// Each `__shared__` declaration becomes a reference to the block's own copy of the variable
// (translate_shared, below). Everything else is copied as it is, newlines included, so the
// compiler's line numbers still point into the .cu file (a #line directive names it).
//
//   translate_launches IN.cu OUT.cpp
#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

bool opens(char c) { return c == '(' || c == '<' || c == '[' || c == '{'; }
bool closes(char c) { return c == ')' || c == '>' || c == ']' || c == '}'; }

// Splits "a, f(b, c), d" at the commas outside brackets.
std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char c : s) {
    if (opens(c)) ++depth;
    if (closes(c)) --depth;
    if (c == ',' && depth == 0)
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

// Index of the bracket that closes the one at `open` (same kind, nesting counted).
std::size_t matching(const std::string& s, std::size_t open, char o, char c) {
  int depth = 0;
  for (std::size_t i = open; i < s.size(); ++i) {
    if (s[i] == o) ++depth;
    if (s[i] == c && --depth == 0) return i;
  }
  throw std::runtime_error("unbalanced '" + std::string(1, o) + "'");
}

std::string translate(std::string s) {
  for (std::size_t at; (at = s.find("<<<")) != std::string::npos;) {
    // The kernel's name ends right before "<<<": skip back over template arguments, then
    // over the (possibly qualified) identifier.
    std::size_t begin = at;
    if (s[begin - 1] == '>') {
      int depth = 0;
      do {
        --begin;
        if (s[begin] == '>') ++depth;
        if (s[begin] == '<') --depth;
      } while (depth > 0);
    }
    while (begin > 0 && (std::isalnum(static_cast<unsigned char>(s[begin - 1])) || s[begin - 1] == '_' || s[begin - 1] == ':'))
      --begin;
    const std::string kernel = s.substr(begin, at - begin);
    const std::size_t cfg_end = s.find(">>>", at);
    if (cfg_end == std::string::npos || s[cfg_end + 3] != '(') throw std::runtime_error("launch of " + kernel + ": no '>>>('");
    const std::vector<std::string> cfg = split_top_level(s.substr(at + 3, cfg_end - at - 3));
    if (cfg.size() < 2) throw std::runtime_error("launch of " + kernel + ": needs blocks and threads");
    // cfg[2] (dynamic shared memory) is not emulated: refuse a launch that asks for it.
    if (cfg.size() > 2 && cfg[2].find_first_not_of(" \t\n0") != std::string::npos)
      throw std::runtime_error("launch of " + kernel + ": dynamic shared memory is not emulated");
    const std::size_t args_end = matching(s, cfg_end + 3, '(', ')');
    const std::string args = s.substr(cfg_end + 4, args_end - cfg_end - 4);
    const std::string stream = cfg.size() > 3 ? cfg[3] : "nullptr";  // none: the legacy default stream
    const std::string call = "::mf::emulator::launch(" + stream + ", dim3(" + cfg[0] + "), dim3(" + cfg[1] +
                             "), [=] { " + kernel + "(" + args + "); })";
    s = s.substr(0, begin) + call + s.substr(args_end + 1);
  }
  return s;
}

bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string trim(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// `__shared__ float a[8][32], b[8];` becomes
//   auto& a = ::mf::emulator::block_shared<float[8][32]>([] {}); auto& b = ...<float[8]>([] {});
// so that each block of a launch has its own copy (cuda_emulator.h, block_shared). The type
// is what comes before the first declarator's name; a declarator is a name and its array
// bounds. Newlines inside the declaration are kept, so line numbers stay.
std::string translate_shared(std::string s) {
  const std::string kw = "__shared__";
  for (std::size_t at = 0; (at = s.find(kw, at)) != std::string::npos;) {
    const bool word = (at == 0 || !ident(s[at - 1])) && !ident(s[at + kw.size()]);
    const std::size_t line = s.rfind('\n', at) == std::string::npos ? 0 : s.rfind('\n', at) + 1;
    if (!word || s.substr(line, at - line).find("//") != std::string::npos) {  // in a comment
      at += kw.size();
      continue;
    }
    const std::size_t end = s.find(';', at);
    if (end == std::string::npos) throw std::runtime_error("__shared__ declaration without ';'");
    const std::string decl = s.substr(at + kw.size(), end - at - kw.size());
    const std::vector<std::string> parts = split_top_level(decl);
    // The first declarator's name: the last identifier before its first '[' (or its end).
    const std::string& first = parts[0];
    std::size_t name_end = first.find('[');
    if (name_end == std::string::npos) name_end = first.size();
    while (name_end > 0 && !ident(first[name_end - 1])) --name_end;
    std::size_t name_begin = name_end;
    while (name_begin > 0 && ident(first[name_begin - 1])) --name_begin;
    const std::string type = trim(first.substr(0, name_begin));
    if (type.empty() || name_begin == name_end) throw std::runtime_error("cannot read __shared__" + decl);
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const std::string d = trim(i == 0 ? first.substr(name_begin) : parts[i]);
      std::size_t n = 0;
      while (n < d.size() && ident(d[n])) ++n;
      if (n == 0 || d.find('=') != std::string::npos) throw std::runtime_error("cannot read __shared__" + decl);
      out += "auto& " + d.substr(0, n) + " = ::mf::emulator::block_shared<" + type + " " + trim(d.substr(n)) +
             ">([] {})" + (i + 1 < parts.size() ? "; " : "");
    }
    for (char c : decl)
      if (c == '\n') out += '\n';
    s = s.substr(0, at) + out + s.substr(end);
    at += out.size();
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: translate_launches IN.cu OUT.cpp\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) throw std::runtime_error("cannot read it");
    std::ostringstream text;
    text << in.rdbuf();
    std::ofstream out(argv[2], std::ios::binary);
    out << "// Generated from " << argv[1] << " by translate_launches: do not edit.\n"
        << "#line 1 \"" << argv[1] << "\"\n"
        << translate_shared(translate(text.str()));
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "translate_launches: " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
