// Bearer tokens with roles: the token file, constant-time lookup, and per-token counters.
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/server_context.h"
#include "kernels/key/digest.h"
#include "kernels/util/status_macros.h"
#include "openssl/crypto.h"
#include "server/auth/auth.h"

namespace kiln::auth {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr absl::string_view kBearer = "Bearer ";

std::string TokenHash(absl::string_view token) {
  absl::StatusOr<std::string> raw = key::Sha256(std::string_view(token.data(), token.size()));
  return raw.ok() ? *std::move(raw) : std::string(key::kDigestBytes, '\0');
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kCompile:
      return "compile";
    case Role::kAdmin:
      return "admin";
    case Role::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kRead, Role::kCompile, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", name, "' (roles: read, compile, admin)"));
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       absl::string_view file_name) {
  std::vector<TokenEntry> entries;
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<std::string> hashes;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](absl::string_view rule) {
      return absl::InvalidArgumentError(absl::StrCat(file_name, ":", line_number, ": ", rule));
    };
    if (fields.size() < 3 || fields.size() > 4) {
      return bad("expected NAME ROLE TOKEN [compiles=N]");
    }
    TokenEntry entry;
    entry.name = std::string(fields[0]);
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) return bad(role.status().message());
    entry.role = *role;
    if (fields[2].size() < kMinTokenLength) {
      return bad(absl::StrCat("the token of '", entry.name, "' is shorter than ", kMinTokenLength,
                              " characters"));
    }
    entry.token_sha256 = TokenHash(fields[2]);
    if (fields.size() == 4) {
      absl::string_view limit = fields[3];
      if (!absl::ConsumePrefix(&limit, "compiles=") ||
          !absl::SimpleAtoi(limit, &entry.max_compiles) || entry.max_compiles < 1) {
        return bad("the fourth field must be compiles=N with N >= 1");
      }
    }
    if (!names.insert(entry.name).second) {
      return bad(absl::StrCat("the name '", entry.name, "' is used twice"));
    }
    if (!hashes.insert(entry.token_sha256).second) {
      return bad(absl::StrCat("the token of '", entry.name, "' is used twice"));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

// ---------------------------------------------------------------------------- Authorizer

struct Authorizer::Table {
  std::vector<TokenEntry> entries;
  std::vector<std::shared_ptr<TokenCounters>> counters;  // parallel to entries
};

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(const std::string& token_file,
                                                               int default_max_compiles) {
  std::unique_ptr<Authorizer> authorizer(new Authorizer(token_file, default_max_compiles));
  KILN_RETURN_IF_ERROR(authorizer->Reload());
  return authorizer;
}

absl::StatusOr<std::shared_ptr<const Authorizer::Table>> Authorizer::ReadTable() const {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(token_file_, "token file"));
  auto table = std::make_shared<Table>();
  KILN_ASSIGN_OR_RETURN(table->entries, ParseTokenFile(text, token_file_));
  for (TokenEntry& e : table->entries) {
    if (e.max_compiles == 0) e.max_compiles = default_max_compiles_;
  }
  return table;
}

absl::Status Authorizer::Reload() {
  if (!enabled()) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const Table> read, ReadTable());
  auto table = std::make_shared<Table>(*read);
  absl::MutexLock lock(&mu_);
  for (const TokenEntry& e : table->entries) {
    std::shared_ptr<TokenCounters>& c = counters_[e.name];
    if (c == nullptr) c = std::make_shared<TokenCounters>();
    table->counters.push_back(c);
  }
  table_ = std::move(table);
  return absl::OkStatus();
}

std::shared_ptr<const Authorizer::Table> Authorizer::CurrentTable() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::StatusOr<Caller> Authorizer::Authorize(const grpc::ServerContextBase& context, Role needed,
                                             absl::string_view method) const {
  if (!enabled()) return AuthorizeHeader("", needed, method);
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  const absl::string_view header = it == metadata.end()
                                       ? absl::string_view()
                                       : absl::string_view(it->second.data(), it->second.size());
  return AuthorizeHeader(header, needed, method);
}

absl::StatusOr<Caller> Authorizer::AuthorizeHeader(absl::string_view authorization, Role needed,
                                                   absl::string_view method) const {
  if (!enabled()) {
    anonymous_->requests.fetch_add(1, std::memory_order_relaxed);
    return Caller{"anonymous", Role::kAdmin, 0, anonymous_};
  }
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, kBearer) || token.empty()) {
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnauthenticatedError(
        absl::StrCat(method, " needs a bearer token (metadata 'authorization: Bearer TOKEN')"));
  }
  const std::string presented = TokenHash(absl::StripAsciiWhitespace(token));
  std::shared_ptr<const Table> table = CurrentTable();
  // Every entry is compared, whatever matched, and each comparison takes the same time.
  int found = -1;
  for (size_t i = 0; i < table->entries.size(); ++i) {
    const bool equal = CRYPTO_memcmp(presented.data(), table->entries[i].token_sha256.data(),
                                     key::kDigestBytes) == 0;
    found = equal ? static_cast<int>(i) : found;
  }
  if (found < 0) {
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnauthenticatedError(absl::StrCat(method, ": the bearer token is not known"));
  }
  const TokenEntry& entry = table->entries[found];
  const std::shared_ptr<TokenCounters>& counters = table->counters[found];
  if (entry.role < needed) {
    counters->denied.fetch_add(1, std::memory_order_relaxed);
    return absl::PermissionDeniedError(absl::StrCat(method, " needs role '", RoleName(needed),
                                                    "'; token '", entry.name, "' has role '",
                                                    RoleName(entry.role), "'"));
  }
  counters->requests.fetch_add(1, std::memory_order_relaxed);
  return Caller{entry.name, entry.role, entry.max_compiles, counters};
}

std::shared_ptr<CompileSlot> Authorizer::TryAcquireCompile(const Caller& caller) {
  TokenCounters& c = *caller.counters;
  const int64_t now = c.compiles_in_flight.fetch_add(1, std::memory_order_relaxed) + 1;
  if (caller.max_compiles > 0 && now > caller.max_compiles) {
    c.compiles_in_flight.fetch_sub(1, std::memory_order_relaxed);
    c.limited.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return std::make_shared<CompileSlot>(caller.counters);
}

void Authorizer::AddStats(v1::GetStatsResponse* stats) const {
  if (!enabled()) return;
  stats->set_unauthenticated(unauthenticated_.load(std::memory_order_relaxed));
  std::shared_ptr<const Table> table = CurrentTable();
  for (size_t i = 0; i < table->entries.size(); ++i) {
    const TokenCounters& c = *table->counters[i];
    v1::TokenStats* t = stats->add_tokens();
    t->set_name(table->entries[i].name);
    t->set_role(std::string(RoleName(table->entries[i].role)));
    t->set_requests(c.requests.load(std::memory_order_relaxed));
    t->set_denied(c.denied.load(std::memory_order_relaxed));
    t->set_compiles_in_flight(c.compiles_in_flight.load(std::memory_order_relaxed));
    t->set_limited(c.limited.load(std::memory_order_relaxed));
  }
}

}  // namespace kiln::auth
