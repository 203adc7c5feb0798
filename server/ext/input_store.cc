#include "server/ext/input_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/key/digest.h"
#include "kernels/toolchain/subprocess.h"

namespace kiln::ext {
namespace {

namespace fs = std::filesystem;

std::string TempName(const std::string& final_path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(final_path, ".tmp", getpid(), "-", counter.fetch_add(1));
}

}  // namespace

bool IsHexDigest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool IsCleanRelativePath(const std::string& path) {
  if (path.empty() || path.size() > 4096 || path.find('\0') != std::string::npos) return false;
  if (path.front() == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<InputStore>> InputStore::Open(const std::string& dir,
                                                             const std::string& trees_dir,
                                                             int64_t capacity_bytes,
                                                             SharedInputs shared) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "blobs", ec);
  if (!ec) fs::create_directories(trees_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::unique_ptr<InputStore> store(
      new InputStore(dir, trees_dir, capacity_bytes, std::move(shared)));
  absl::MutexLock lock(&store->mu_);
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "blobs", ec)) {
    std::string name = e.path().filename().string();
    if (!IsHexDigest(name)) {
      fs::remove(e.path(), ec);  // a temporary left by a crash
      continue;
    }
    int64_t size = static_cast<int64_t>(e.file_size(ec));
    store->held_[name] = Held{size, ++store->tick_};
    store->bytes_ += size;
  }
  // Trees left half-built by a crash.
  for (const auto& e : fs::directory_iterator(trees_dir, ec)) {
    if (!IsHexDigest(e.path().filename().string())) fs::remove_all(e.path(), ec);
  }
  return store;
}

bool InputStore::Has(const std::string& hex) const {
  absl::MutexLock lock(&mu_);
  return held_.contains(hex);
}

bool InputStore::Reachable(const std::string& hex) const {
  return Has(hex) || (shared_ && IsHexDigest(hex) && shared_.has(hex));
}

bool InputStore::Ensure(const std::string& hex) {
  if (Has(hex)) return true;
  if (!shared_ || !IsHexDigest(hex)) return false;
  std::optional<std::string> bytes = shared_.get(hex);
  if (!bytes.has_value()) return false;
  // The tier verifies; PutLocal's own hash checks again, since a wrong blob would be built
  // from (stored under its real digest, it serves nothing that asks for `hex`).
  bool inserted = false;
  absl::StatusOr<std::string> stored = PutLocal(*bytes, &inserted);
  return stored.ok() && *stored == hex;
}

absl::StatusOr<std::string> InputStore::Put(const std::string& bytes) {
  bool inserted = false;
  absl::StatusOr<std::string> hex = PutLocal(bytes, &inserted);
  if (hex.ok() && inserted && shared_) shared_.put(*hex, bytes);
  return hex;
}

void InputStore::Touch(const std::string& hex) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(hex);
  if (it != held_.end()) it->second.tick = ++tick_;
}

absl::StatusOr<std::string> InputStore::PutLocal(const std::string& bytes, bool* inserted) {
  std::string hex = key::Sha256Hex(bytes);
  *inserted = false;
  if (Has(hex)) {
    Touch(hex);
    return hex;
  }
  std::string path = absl::StrCat(dir_, "/blobs/", hex);
  std::string tmp = TempName(path);
  if (absl::Status s = toolchain::WriteFile(tmp, bytes); !s.ok()) return s;
  chmod(tmp.c_str(), 0444);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("cannot store an input blob: ", ec.message()));
  }
  absl::MutexLock lock(&mu_);
  auto [it, added] = held_.try_emplace(hex, Held{static_cast<int64_t>(bytes.size()), 0});
  it->second.tick = ++tick_;
  if (added) bytes_ += static_cast<int64_t>(bytes.size());
  *inserted = added;
  EvictLocked();
  return hex;
}

absl::StatusOr<std::string> InputStore::Get(const std::string& hex) {
  if (!IsHexDigest(hex)) return absl::InvalidArgumentError(absl::StrCat("bad digest '", hex, "'"));
  std::string path = absl::StrCat(dir_, "/blobs/", hex);
  absl::StatusOr<std::string> bytes = toolchain::ReadFile(path);
  if (bytes.ok() && key::Sha256Hex(*bytes) == hex) {
    Touch(hex);
    return bytes;
  }
  std::error_code ec;
  fs::remove(path, ec);
  absl::MutexLock lock(&mu_);
  if (auto it = held_.find(hex); it != held_.end()) {
    bytes_ -= it->second.size;
    held_.erase(it);
  }
  return absl::NotFoundError(absl::StrCat("input blob ", hex, " is not held"));
}

void InputStore::EvictLocked() {
  if (capacity_ <= 0 || bytes_ <= capacity_) return;
  std::vector<std::pair<uint64_t, std::string>> order;
  order.reserve(held_.size());
  for (const auto& [hex, h] : held_) order.emplace_back(h.tick, hex);
  std::sort(order.begin(), order.end());
  std::error_code ec;
  for (const auto& [tick, hex] : order) {
    if (bytes_ <= capacity_ * 9 / 10) break;
    fs::remove(absl::StrCat(dir_, "/blobs/", hex), ec);
    fs::remove_all(absl::StrCat(trees_dir_, "/", hex), ec);
    bytes_ -= held_[hex].size;
    held_.erase(hex);
  }
}

absl::StatusOr<v1::InputTree> InputStore::ReadTree(const std::string& hex) {
  absl::StatusOr<std::string> bytes = Get(hex);
  if (!bytes.ok()) return bytes.status();
  v1::InputTree tree;
  if (!tree.ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("blob ", hex, " is not an InputTree"));
  }
  for (int i = 0; i < tree.files_size(); ++i) {
    const v1::InputFile& f = tree.files(i);
    if (!IsCleanRelativePath(f.path())) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", hex.substr(0, 12), ": path '",
                                                     f.path(), "' is not a clean relative path"));
    }
    if (!IsHexDigest(f.digest())) {
      return absl::InvalidArgumentError(absl::StrCat("tree ", hex.substr(0, 12), ": file '",
                                                     f.path(), "' has a malformed digest"));
    }
    if (i > 0) {
      const std::string& prev = tree.files(i - 1).path();
      if (prev >= f.path()) {
        return absl::InvalidArgumentError(absl::StrCat("tree ", hex.substr(0, 12),
                                                       ": paths must be sorted and unique ('", prev,
                                                       "', '", f.path(), "')"));
      }
      if (absl::StartsWith(f.path(), prev + "/")) {
        return absl::InvalidArgumentError(
            absl::StrCat("tree ", hex.substr(0, 12), ": '", prev, "' is both a file and a folder"));
      }
    }
  }
  return tree;
}

std::vector<std::string> InputStore::MissingFor(const std::string& tree_hex) {
  if (!Ensure(tree_hex)) return {tree_hex};
  absl::StatusOr<v1::InputTree> tree = ReadTree(tree_hex);
  if (!tree.ok()) return {tree_hex};
  std::vector<std::string> missing;
  for (const v1::InputFile& f : tree->files()) {
    if (!Ensure(f.digest())) missing.push_back(f.digest());
  }
  return missing;
}

absl::StatusOr<std::string> InputStore::Materialize(const std::string& tree_hex) {
  std::string final_dir = absl::StrCat(trees_dir_, "/", tree_hex);
  std::error_code ec;
  absl::MutexLock build_lock(&materialize_mu_);
  if (fs::is_directory(final_dir, ec)) {
    Touch(tree_hex);
    return final_dir;
  }
  absl::StatusOr<v1::InputTree> tree = ReadTree(tree_hex);
  if (!tree.ok()) return tree.status();
  std::string tmp = TempName(final_dir);
  fs::create_directories(tmp, ec);
  for (const v1::InputFile& f : tree->files()) {
    fs::path dst = fs::path(tmp) / f.path();
    fs::create_directories(dst.parent_path(), ec);
    std::string blob = absl::StrCat(dir_, "/blobs/", f.digest());
    if (!Has(f.digest())) {
      fs::remove_all(tmp, ec);
      return absl::NotFoundError(
          absl::StrCat("input blob ", f.digest(), " ('", f.path(), "') is not held"));
    }
    ec.clear();
    fs::create_hard_link(blob, dst, ec);
    if (ec) {
      // Another filesystem, or links not allowed: copy, verified.
      absl::StatusOr<std::string> bytes = Get(f.digest());
      if (!bytes.ok() || !toolchain::WriteFile(dst.string(), *bytes).ok()) {
        fs::remove_all(tmp, ec);
        return absl::NotFoundError(
            absl::StrCat("input blob ", f.digest(), " ('", f.path(), "') is not held"));
      }
      chmod(dst.c_str(), 0444);
    }
    Touch(f.digest());
  }
  // Readable by the sandbox's identity; it mounts them read-only.
  for (auto it = fs::recursive_directory_iterator(tmp, ec);
       it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory(ec)) chmod(it->path().c_str(), 0755);
  }
  chmod(tmp.c_str(), 0755);
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (!fs::is_directory(final_dir))
      return absl::UnavailableError("cannot materialize an input tree");
  }
  Touch(tree_hex);
  return final_dir;
}

int64_t InputStore::blobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(held_.size());
}

int64_t InputStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace kiln::ext
