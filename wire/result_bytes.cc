#include "wire/result_bytes.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/key/byte_writer.h"

namespace kiln::wire {
namespace {

constexpr char kDomain[] = "kiln-result-signature-v1\n";

// ---------------------------------------------------------------------------- the wire format

enum WireType : int {
  kVarint = 0,
  kFixed64 = 1,
  kLength = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// Groups (a protobuf 2 encoding no kiln message uses) are skipped, nested up to this depth.
constexpr int kMaxGroupDepth = 64;

// One field as read off the wire: its value in `varint` (kVarint) or `bytes` (kLength); values
// of the other wire types are skipped, as no field the encoding covers has them.
struct Field {
  uint32_t number = 0;
  int type = 0;
  uint64_t varint = 0;
  std::string_view bytes;
};

// Scalars as protobuf's parsers convert them: int32 and enum fields keep the low 32 bits as a
// signed value, uint32 fields as an unsigned one, int64 fields all 64 bits.
int64_t AsInt32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }
int64_t AsUint32(uint64_t v) { return static_cast<uint32_t>(v); }
int64_t AsInt64(uint64_t v) { return static_cast<int64_t>(v); }

// ---------------------------------------------------------------------------- decoded fields
// Only what the encoding covers; strings point into the serialized bytes.

struct Term {
  int64_t coeff = 0;
  std::vector<int64_t> exponents;
};
struct Expr {
  std::vector<Term> terms;
};
struct Buffer {
  int64_t role = 0, index = 0, dtype = 0;
  std::vector<int64_t> shape;
  int64_t bytes = 0, offset = 0;
  std::vector<Expr> shape_exprs;
  Expr bytes_expr;
};
struct Step {
  std::string_view kernel;
  std::vector<int64_t> grid, block;
  int64_t shared_bytes = 0;
  std::vector<int64_t> args;
  Expr grid_work;
  int64_t grid_per_block = 0;
  Expr guard;
  int64_t guard_min = 0, guard_max = 0;
};
struct Symbol {
  std::string_view name;
  int64_t input = 0, axis = 0;
};
struct Plan {
  std::vector<Buffer> buffers;
  std::vector<Step> steps;
  int64_t workspace_bytes = 0, abi_version = 0;
  std::vector<Symbol> symbols;
  Expr index_bound;
};
struct Artifact {
  int64_t kind = 0;
  std::string_view digest;
  int64_t size = 0;
};
enum class TargetKind { kNone, kCpu, kCuda };
struct Target {
  TargetKind kind = TargetKind::kNone;  // the oneof: the last of cpu and cuda on the wire
  std::string_view isa;
  std::vector<std::string_view> features;
  int64_t sm = 0;
};
struct KeyField {
  std::string_view label, value;
};
struct Signature {
  bool present = false;
  std::string_view algorithm, key_id, signature;
};
struct Result {
  std::vector<Artifact> artifacts;
  Plan plan;
  std::string_view key_debug;
  Target target;
  std::vector<KeyField> key_fields;
  Signature signature;
};

// ---------------------------------------------------------------------------- decoding

// Decodes the messages of one serialization into the structs above. Every Decode* merges into
// its output, as protobuf parsing does (a singular message given twice is merged). The first
// failure is kept in error(); every call after it fails.
class Decoder {
 public:
  explicit Decoder(std::string_view all) : origin_(all.data()) {}

  const std::string& error() const { return error_; }

  bool DecodeResult(std::string_view m, Result* r) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Repeated(f, &r->artifacts, &Decoder::DecodeArtifact);
        case 2:
          return Message(f, &r->plan, &Decoder::DecodePlan);
        case 5:
          return Str(f, &r->key_debug);
        case 6:
          return Message(f, &r->target, &Decoder::DecodeTarget);
        case 7:
          return Repeated(f, &r->key_fields, &Decoder::DecodeKeyField);
        case 16:
          if (f.type == kLength) r->signature.present = true;
          return Message(f, &r->signature, &Decoder::DecodeSignature);
        default:  // compile_log and stats: not signed
          return true;
      }
    });
  }

 private:
  bool DecodeArtifact(std::string_view m, Artifact* a) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Scalar(f, AsInt32, &a->kind);
        case 2:
          return Str(f, &a->digest);
        case 3:
          return Scalar(f, AsInt64, &a->size);
        default:
          return true;
      }
    });
  }

  bool DecodeTarget(std::string_view m, Target* t) {
    return ForEachField(m, [&](const Field& f) {
      if (f.type != kLength || (f.number != 1 && f.number != 2)) return true;
      // A oneof: a member other than the one set clears it first.
      const TargetKind kind = f.number == 1 ? TargetKind::kCpu : TargetKind::kCuda;
      if (t->kind != kind) {
        t->isa = {};
        t->features.clear();
        t->sm = 0;
        t->kind = kind;
      }
      return kind == TargetKind::kCpu ? DecodeCpuTarget(f.bytes, t) : DecodeCudaTarget(f.bytes, t);
    });
  }

  bool DecodeCpuTarget(std::string_view m, Target* t) {
    return ForEachField(m, [&](const Field& f) {
      if (f.number == 1) return Str(f, &t->isa);
      if (f.number == 2 && f.type == kLength) t->features.push_back(f.bytes);
      return true;
    });
  }

  bool DecodeCudaTarget(std::string_view m, Target* t) {
    return ForEachField(
        m, [&](const Field& f) { return f.number == 1 ? Scalar(f, AsInt32, &t->sm) : true; });
  }

  bool DecodePlan(std::string_view m, Plan* p) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Repeated(f, &p->buffers, &Decoder::DecodeBuffer);
        case 2:
          return Repeated(f, &p->steps, &Decoder::DecodeStep);
        case 3:
          return Scalar(f, AsInt64, &p->workspace_bytes);
        case 4:
          return Scalar(f, AsUint32, &p->abi_version);
        case 5:
          return Repeated(f, &p->symbols, &Decoder::DecodeSymbol);
        case 6:
          return Message(f, &p->index_bound, &Decoder::DecodeExpr);
        default:
          return true;
      }
    });
  }

  bool DecodeBuffer(std::string_view m, Buffer* b) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Scalar(f, AsInt32, &b->role);
        case 2:
          return Scalar(f, AsInt32, &b->index);
        case 3:
          return Scalar(f, AsInt32, &b->dtype);
        case 4:
          return Ints(f, AsInt64, &b->shape);
        case 5:
          return Scalar(f, AsInt64, &b->bytes);
        case 6:
          return Scalar(f, AsInt64, &b->offset);
        case 7:
          return Repeated(f, &b->shape_exprs, &Decoder::DecodeExpr);
        case 8:
          return Message(f, &b->bytes_expr, &Decoder::DecodeExpr);
        default:
          return true;
      }
    });
  }

  bool DecodeStep(std::string_view m, Step* s) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Str(f, &s->kernel);
        case 2:
          return Ints(f, AsUint32, &s->grid);
        case 3:
          return Ints(f, AsUint32, &s->block);
        case 4:
          return Scalar(f, AsUint32, &s->shared_bytes);
        case 5:
          return Ints(f, AsInt32, &s->args);
        case 6:
          return Message(f, &s->grid_work, &Decoder::DecodeExpr);
        case 7:
          return Scalar(f, AsInt64, &s->grid_per_block);
        case 8:
          return Message(f, &s->guard, &Decoder::DecodeExpr);
        case 9:
          return Scalar(f, AsInt64, &s->guard_min);
        case 10:
          return Scalar(f, AsInt64, &s->guard_max);
        default:
          return true;
      }
    });
  }

  bool DecodeSymbol(std::string_view m, Symbol* s) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Str(f, &s->name);
        case 2:
          return Scalar(f, AsInt32, &s->input);
        case 3:
          return Scalar(f, AsInt32, &s->axis);
        default:
          return true;
      }
    });
  }

  bool DecodeExpr(std::string_view m, Expr* e) {
    return ForEachField(m, [&](const Field& f) {
      return f.number == 1 ? Repeated(f, &e->terms, &Decoder::DecodeTerm) : true;
    });
  }

  bool DecodeTerm(std::string_view m, Term* t) {
    return ForEachField(m, [&](const Field& f) {
      if (f.number == 1) return Scalar(f, AsInt64, &t->coeff);
      if (f.number == 2) return Ints(f, AsInt32, &t->exponents);
      return true;
    });
  }

  bool DecodeKeyField(std::string_view m, KeyField* k) {
    return ForEachField(m, [&](const Field& f) {
      if (f.number == 1) return Str(f, &k->label);
      if (f.number == 2) return Str(f, &k->value);
      return true;
    });
  }

  bool DecodeSignature(std::string_view m, Signature* s) {
    return ForEachField(m, [&](const Field& f) {
      switch (f.number) {
        case 1:
          return Str(f, &s->algorithm);
        case 2:
          return Str(f, &s->key_id);
        case 3:
          return Str(f, &s->signature);
        default:
          return true;
      }
    });
  }

  // A field of a known number but another wire type than its declaration's is skipped, as
  // protobuf's parsers keep it among the unknown fields. So each helper below takes the field
  // when its type fits and otherwise leaves the output as it is.

  static bool Scalar(const Field& f, int64_t (*as)(uint64_t), int64_t* out) {
    if (f.type == kVarint) *out = as(f.varint);
    return true;
  }

  static bool Str(const Field& f, std::string_view* out) {
    if (f.type == kLength) *out = f.bytes;
    return true;
  }

  // A repeated integer field: one value (unpacked) or a run of varints (packed).
  bool Ints(const Field& f, int64_t (*as)(uint64_t), std::vector<int64_t>* out) {
    if (f.type == kVarint) {
      out->push_back(as(f.varint));
    } else if (f.type == kLength) {
      const char* p = f.bytes.data();
      const char* end = p + f.bytes.size();
      while (p < end) {
        uint64_t v = 0;
        if (!ReadVarint(&p, end, &v)) return false;
        out->push_back(as(v));
      }
    }
    return true;
  }

  template <typename T>
  bool Message(const Field& f, T* out, bool (Decoder::*decode)(std::string_view, T*)) {
    return f.type != kLength || (this->*decode)(f.bytes, out);
  }

  template <typename T>
  bool Repeated(const Field& f, std::vector<T>* out,
                bool (Decoder::*decode)(std::string_view, T*)) {
    if (f.type != kLength) return true;
    out->emplace_back();
    return (this->*decode)(f.bytes, &out->back());
  }

  // Calls on(field) for each field of message `m` in wire order; false on the first failure,
  // of the bytes or of `on`.
  template <typename On>
  bool ForEachField(std::string_view m, On on) {
    const char* p = m.data();
    const char* end = p + m.size();
    while (p < end) {
      Field f;
      if (!ReadField(&p, end, &f, 0)) return false;
      if (f.type == kEndGroup) return Fail(p, "an end-group tag outside any group");
      if (!on(f)) return false;
    }
    return error_.empty();
  }

  // Reads one field's tag and value at *p; an end-group tag is returned as a field of that type
  // for the group being skipped to match.
  bool ReadField(const char** p, const char* end, Field* f, int depth) {
    const char* at = *p;
    uint64_t tag = 0;
    if (!ReadVarint(p, end, &tag)) return false;
    if (tag > UINT32_MAX || (tag >> 3) == 0) return Fail(at, "an invalid field number");
    f->number = static_cast<uint32_t>(tag >> 3);
    f->type = static_cast<int>(tag & 7);
    switch (f->type) {
      case kVarint:
        return ReadVarint(p, end, &f->varint);
      case kFixed64:
        return Skip(p, end, 8);
      case kFixed32:
        return Skip(p, end, 4);
      case kLength: {
        uint64_t n = 0;
        if (!ReadVarint(p, end, &n)) return false;
        if (n > static_cast<uint64_t>(end - *p)) return Fail(at, "a length past the end");
        f->bytes = std::string_view(*p, n);
        *p += n;
        return true;
      }
      case kStartGroup:
        return SkipGroup(p, end, f->number, depth + 1, at);
      case kEndGroup:
        return true;
      default:
        return Fail(at, "an invalid wire type");
    }
  }

  bool SkipGroup(const char** p, const char* end, uint32_t number, int depth, const char* at) {
    if (depth > kMaxGroupDepth) return Fail(at, "groups nested too deep");
    while (*p < end) {
      Field f;
      if (!ReadField(p, end, &f, depth)) return false;
      if (f.type == kEndGroup) {
        return f.number == number ? true
                                  : Fail(at, "a group closed by another field's end-group tag");
      }
    }
    return Fail(at, "a group with no end");
  }

  bool Skip(const char** p, const char* end, size_t n) {
    if (static_cast<size_t>(end - *p) < n) return Fail(*p, "a truncated fixed-size value");
    *p += n;
    return true;
  }

  // A varint of at most 10 bytes (the bits past 64 dropped, as protobuf's parsers do).
  bool ReadVarint(const char** p, const char* end, uint64_t* v) {
    const char* at = *p;
    uint64_t value = 0;
    for (int i = 0; i < 10; ++i) {
      if (*p == end) return Fail(at, "a truncated varint");
      const auto byte = static_cast<uint8_t>(*(*p)++);
      value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        *v = value;
        return true;
      }
    }
    return Fail(at, "a varint longer than 10 bytes");
  }

  bool Fail(const char* at, const char* what) {
    if (error_.empty()) {
      error_ = std::string("not a serialized kiln.v1.ActionResult: ") + what + " at byte " +
               std::to_string(at - origin_);
    }
    return false;
  }

  const char* origin_;  // the start of the serialization, for the offsets errors name
  std::string error_;
};

// ---------------------------------------------------------------------------- encoding

// The canonical encoding (FORMAT.md): kernels/key/byte_writer.h's integers, strings and lists,
// and a polynomial as its term count, then each term's coefficient and exponent list.
class Encoder : public key::ByteWriter {
 public:
  void Polynomial(const Expr& x) {
    Int(static_cast<int64_t>(x.terms.size()));
    for (const Term& t : x.terms) {
      Int(t.coeff);
      Ints(t.exponents);
    }
  }
};

std::string Encode(std::string_view handle, const Result& result) {
  Encoder e;
  e.Raw(kDomain);
  e.Str(handle);
  const Target& target = result.target;
  if (target.kind == TargetKind::kCpu) {
    e.Int(1);
    e.Str(target.isa);
    e.Int(static_cast<int64_t>(target.features.size()));
    for (std::string_view f : target.features) e.Str(f);
  } else if (target.kind == TargetKind::kCuda) {
    e.Int(2);
    e.Int(target.sm);
  } else {
    e.Int(0);
  }
  e.Int(static_cast<int64_t>(result.artifacts.size()));
  for (const Artifact& a : result.artifacts) {
    e.Int(a.kind);
    e.Str(a.digest);
    e.Int(a.size);
  }
  const Plan& plan = result.plan;
  e.Int(static_cast<int64_t>(plan.buffers.size()));
  for (const Buffer& b : plan.buffers) {
    e.Int(b.role);
    e.Int(b.index);
    e.Int(b.dtype);
    e.Ints(b.shape);
    e.Int(b.bytes);
    e.Int(b.offset);
  }
  e.Int(static_cast<int64_t>(plan.steps.size()));
  for (const Step& s : plan.steps) {
    e.Str(s.kernel);
    e.Ints(s.grid);
    e.Ints(s.block);
    e.Int(s.shared_bytes);
    e.Ints(s.args);
  }
  e.Int(plan.workspace_bytes);
  e.Int(plan.abi_version);
  if (!plan.symbols.empty()) {  // symbolic plans only, so every other record signs as before
    e.Int(static_cast<int64_t>(plan.symbols.size()));
    for (const Symbol& s : plan.symbols) {
      e.Str(s.name);
      e.Int(s.input);
      e.Int(s.axis);
    }
    for (const Buffer& b : plan.buffers) {
      e.Int(static_cast<int64_t>(b.shape_exprs.size()));
      for (const Expr& x : b.shape_exprs) e.Polynomial(x);
      e.Polynomial(b.bytes_expr);
    }
    // Symbolic CUDA plans (launches sized at run time) only: CPU ones sign as before.
    const bool sized_launches = std::any_of(plan.steps.begin(), plan.steps.end(),
                                            [](const Step& s) { return s.grid_per_block > 0; });
    if (sized_launches) {
      for (const Step& s : plan.steps) {
        e.Polynomial(s.grid_work);
        e.Int(s.grid_per_block);
      }
      e.Polynomial(plan.index_bound);
      // Launch-time choices among kernels: plans that have them only (older ones sign as before).
      const bool guarded = std::any_of(plan.steps.begin(), plan.steps.end(), [](const Step& s) {
        return s.guard_min > 0 || s.guard_max > 0;
      });
      if (guarded) {
        for (const Step& s : plan.steps) {
          e.Polynomial(s.guard);
          e.Int(s.guard_min);
          e.Int(s.guard_max);
        }
      }
    }
  }
  e.Str(result.key_debug);
  e.Int(static_cast<int64_t>(result.key_fields.size()));
  for (const KeyField& f : result.key_fields) {
    e.Str(f.label);
    e.Str(f.value);
  }
  return e.Take();
}

}  // namespace

std::optional<SignedResult> DecodeSignedResult(std::string_view handle,
                                               std::string_view serialized_result,
                                               std::string* error) {
  Decoder decoder(serialized_result);
  Result result;
  if (!decoder.DecodeResult(serialized_result, &result)) {
    *error = decoder.error();
    return std::nullopt;
  }
  SignedResult out;
  out.bytes = Encode(handle, result);
  out.has_signature = result.signature.present;
  out.algorithm = std::string(result.signature.algorithm);
  out.key_id = std::string(result.signature.key_id);
  out.signature = std::string(result.signature.signature);
  return out;
}

}  // namespace kiln::wire
