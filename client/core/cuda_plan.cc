#include "client/core/cuda_plan.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>

namespace kiln::core {
namespace {

// A JSON value: just enough of JSON for plan files (objects, arrays, strings without
// escapes beyond \" and \\, numbers, true/false/null).
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  double number = 0;
  bool boolean = false;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  bool Parse(Json* out, std::string* error) {
    if (!Value(out, 0) || (Skip(), pos_ != s_.size())) {
      *error = "plan.json: malformed JSON near byte " + std::to_string(pos_);
      return false;
    }
    return true;
  }

 private:
  void Skip() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\') {
        if (++pos_ >= s_.size()) return false;
        char e = s_[pos_];
        if (e != '"' && e != '\\' && e != '/') return false;
      }
      out->push_back(s_[pos_++]);
    }
    return Eat('"');
  }
  bool Value(Json* v, int depth) {
    if (depth > 16) return false;
    Skip();
    if (pos_ >= s_.size()) return false;
    char c = s_[pos_];
    if (c == '{') {
      v->kind = Json::Kind::kObject;
      ++pos_;
      if (Eat('}')) return true;
      do {
        std::string key;
        Json item;
        if (!String(&key) || !Eat(':') || !Value(&item, depth + 1)) return false;
        v->fields[key] = std::move(item);
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      v->kind = Json::Kind::kArray;
      ++pos_;
      if (Eat(']')) return true;
      do {
        v->items.emplace_back();
        if (!Value(&v->items.back(), depth + 1)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->kind = Json::Kind::kString;
      return String(&v->text);
    }
    if (Word("true") || Word("false")) {
      v->kind = Json::Kind::kBool;
      v->boolean = c == 't';
      return true;
    }
    if (Word("null")) return true;
    std::string num(s_.substr(pos_, std::min<size_t>(32, s_.size() - pos_)));
    char* end = nullptr;
    v->number = std::strtod(num.c_str(), &end);
    if (end == num.c_str()) return false;
    v->kind = Json::Kind::kNumber;
    pos_ += static_cast<size_t>(end - num.c_str());
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// Field access that records the first problem and keeps going with defaults.
class Reader {
 public:
  explicit Reader(std::string* error) : error_(error) {}
  const Json* Field(const Json& o, const char* name, Json::Kind kind) {
    auto it = o.fields.find(name);
    if (it == o.fields.end() || it->second.kind != kind) {
      Fail(std::string("plan.json: field '") + name + "' missing or of the wrong type");
      return nullptr;
    }
    return &it->second;
  }
  int64_t Int(const Json& o, const char* name) {
    const Json* f = Field(o, name, Json::Kind::kNumber);
    return f ? static_cast<int64_t>(f->number) : 0;
  }
  std::string Str(const Json& o, const char* name) {
    const Json* f = Field(o, name, Json::Kind::kString);
    return f ? f->text : "";
  }
  std::vector<int64_t> Ints(const Json& o, const char* name) {
    std::vector<int64_t> out;
    if (const Json* f = Field(o, name, Json::Kind::kArray))
      for (const Json& i : f->items) {
        if (i.kind != Json::Kind::kNumber)
          Fail(std::string("plan.json: '") + name + "' holds a non-number");
        out.push_back(static_cast<int64_t>(i.number));
      }
    return out;
  }
  // The expression in string field `name` (required).
  CudaSizeExpr Expr(const Json& o, const char* name, const std::vector<std::string>& symbols) {
    CudaSizeExpr e;
    std::string why;
    if (const Json* f = Field(o, name, Json::Kind::kString);
        f && !ParseCudaSizeExpr(f->text, symbols, &e, &why))
      Fail(why);
    return e;
  }
  void Fail(const std::string& why) {
    if (error_->empty()) *error_ = why;
  }
  bool ok() const { return error_->empty(); }

 private:
  std::string* error_;
};

std::string_view Trim(std::string_view t) {
  while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  return t;
}

}  // namespace

int64_t CudaSizeExpr::Eval(const int64_t* sizes) const {
  constexpr int64_t kMax = INT64_MAX;
  int64_t total = 0;
  for (const Term& t : terms) {
    int64_t v = t.coeff;
    for (int s : t.symbols)
      if (__builtin_mul_overflow(v, sizes[s], &v)) return kMax;
    if (__builtin_add_overflow(total, v, &total)) return kMax;
  }
  return total;
}

bool ParseCudaSizeExpr(std::string_view text, const std::vector<std::string>& symbols,
                       CudaSizeExpr* out, std::string* error) {
  CudaSizeExpr e;
  const std::string whole(text);
  auto fail = [&](const std::string& why) {
    *error = "plan.json: size expression '" + whole + "': " + why;
    return false;
  };
  while (!text.empty()) {
    size_t plus = text.find(" + ");
    std::string_view term = Trim(text.substr(0, plus));
    text = plus == std::string_view::npos ? std::string_view() : text.substr(plus + 3);
    if (term.empty()) return fail("an empty term");
    CudaSizeExpr::Term t;
    t.coeff = 1;
    while (!term.empty()) {
      size_t star = term.find('*');
      std::string_view f = Trim(term.substr(0, star));
      term = star == std::string_view::npos ? std::string_view() : term.substr(star + 1);
      if (f.empty()) return fail("an empty factor");
      if (f[0] == '-' || (f[0] >= '0' && f[0] <= '9')) {
        const std::string num(f);
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(num.c_str(), &end, 10);
        if (errno != 0 || end != num.c_str() + num.size())
          return fail("'" + num + "' is not an integer");
        if (__builtin_mul_overflow(t.coeff, static_cast<int64_t>(v), &t.coeff))
          return fail("overflow");
        continue;
      }
      auto it = std::find(symbols.begin(), symbols.end(), f);
      if (it == symbols.end()) return fail("unknown symbol '" + std::string(f) + "'");
      t.symbols.push_back(static_cast<int>(it - symbols.begin()));
    }
    e.terms.push_back(std::move(t));
  }
  if (whole == "0") e.terms.clear();
  *out = std::move(e);
  return true;
}

int CudaPlan::num_inputs() const {
  int n = 0;
  for (const Buffer& b : buffers) n += b.role == Role::kInput;
  return n;
}

int CudaPlan::num_outputs() const {
  int n = 0;
  for (const Buffer& b : buffers) n += b.role == Role::kOutput;
  return n;
}

bool ParseCudaPlan(std::string_view json, CudaPlan* plan, std::string* error) {
  error->clear();
  Json root;
  if (!Parser(json).Parse(&root, error)) return false;
  if (root.kind != Json::Kind::kObject) {
    *error = "plan.json: not an object";
    return false;
  }
  Reader r(error);
  CudaPlan p;
  p.abi_version = static_cast<uint32_t>(r.Int(root, "abi_version"));
  p.workspace_bytes = r.Int(root, "workspace_bytes");
  std::vector<std::string> names;
  if (root.fields.count("symbols")) {  // a symbolic plan: its sizes are expressions of these
    if (const Json* syms = r.Field(root, "symbols", Json::Kind::kArray))
      for (const Json& s : syms->items) {
        CudaPlan::Symbol out;
        out.name = r.Str(s, "name");
        out.input = static_cast<int>(r.Int(s, "input"));
        out.axis = static_cast<int>(r.Int(s, "axis"));
        names.push_back(out.name);
        p.symbols.push_back(std::move(out));
      }
  }
  const bool symbolic = !p.symbols.empty();
  if (const Json* bufs = r.Field(root, "buffers", Json::Kind::kArray)) {
    for (const Json& b : bufs->items) {
      CudaPlan::Buffer out;
      std::string role = r.Str(b, "role");
      if (role == "input")
        out.role = CudaPlan::Role::kInput;
      else if (role == "output")
        out.role = CudaPlan::Role::kOutput;
      else if (role == "temp")
        out.role = CudaPlan::Role::kTemp;
      else
        r.Fail("plan.json: unknown buffer role '" + role + "'");
      out.index = static_cast<int>(r.Int(b, "index"));
      out.dtype = r.Str(b, "dtype");
      out.shape = r.Ints(b, "shape");
      out.bytes = r.Int(b, "bytes");
      out.offset = r.Int(b, "offset");
      if (symbolic) {
        if (const Json* dims = r.Field(b, "shape_exprs", Json::Kind::kArray))
          for (const Json& d : dims->items) {
            std::string why;
            CudaSizeExpr e;
            if (d.kind != Json::Kind::kString || !ParseCudaSizeExpr(d.text, names, &e, &why))
              r.Fail(why.empty() ? "plan.json: 'shape_exprs' holds a non-string" : why);
            out.shape_exprs.push_back(std::move(e));
          }
        out.bytes_expr = r.Expr(b, "bytes_expr", names);
      }
      p.buffers.push_back(std::move(out));
    }
  }
  if (const Json* steps = r.Field(root, "steps", Json::Kind::kArray)) {
    for (const Json& s : steps->items) {
      CudaPlan::Step out;
      out.kernel = r.Str(s, "kernel");
      std::vector<int64_t> grid = r.Ints(s, "grid"), block = r.Ints(s, "block");
      for (size_t k = 0; k < 3 && k < grid.size(); ++k)
        out.grid[k] = static_cast<unsigned>(grid[k]);
      for (size_t k = 0; k < 3 && k < block.size(); ++k)
        out.block[k] = static_cast<unsigned>(block[k]);
      out.shared_bytes = static_cast<unsigned>(r.Int(s, "shared_bytes"));
      for (int64_t a : r.Ints(s, "args")) {
        if (a < 0 || a >= static_cast<int64_t>(p.buffers.size()))
          r.Fail("plan.json: step argument out of range");
        out.args.push_back(static_cast<int>(a));
      }
      if (s.fields.count("grid_per_block")) {
        out.grid_per_block = r.Int(s, "grid_per_block");
        out.grid_work = r.Expr(s, "grid_work", names);
      }
      if (s.fields.count("guard")) {
        out.guard = r.Expr(s, "guard", names);
        out.guard_min = r.Int(s, "guard_min");
        out.guard_max = r.Int(s, "guard_max");
      }
      p.steps.push_back(std::move(out));
    }
  }
  if (root.fields.count("index_bound")) p.index_bound = r.Expr(root, "index_bound", names);
  if (!r.ok()) return false;
  if (!CheckCudaPlan(p, error)) {
    *error = "plan.json: " + *error;
    return false;
  }
  *plan = std::move(p);
  return true;
}

bool CheckCudaPlan(const CudaPlan& plan, std::string* error) {
  for (const CudaPlan::Symbol& sym : plan.symbols) {
    bool found = false;
    for (const CudaPlan::Buffer& b : plan.buffers)
      found |= b.role == CudaPlan::Role::kInput && b.index == sym.input && sym.axis >= 0 &&
               static_cast<size_t>(sym.axis) < b.shape_exprs.size();
    if (!found) {
      *error = "symbol '" + sym.name + "' names no input dimension";
      return false;
    }
  }
  for (const CudaPlan::Step& s : plan.steps)
    if (plan.symbolic() ? s.grid_per_block <= 0 : s.grid_per_block < 0) {
      *error = "step " + s.kernel + " has grid_per_block " + std::to_string(s.grid_per_block) +
               (plan.symbolic() ? " (a symbolic plan needs it positive)" : "");
      return false;
    }
  for (const CudaPlan::Step& s : plan.steps)
    if (s.guarded() && (!plan.symbolic() || s.guard_min < 0 || s.guard_max < 0 ||
                        (s.guard_max > 0 && s.guard_max < s.guard_min))) {
      *error = "step " + s.kernel + " has the guard range " + std::to_string(s.guard_min) + ".." +
               std::to_string(s.guard_max) + (plan.symbolic() ? "" : " in a plan without symbols");
      return false;
    }
  return true;
}

}  // namespace kiln::core
