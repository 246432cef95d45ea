// symbols.cpp — finds a kernel's static __shared__ arrays in the executable's symbol table
// (symbols.h says why and how).
//
// The table is read once, from /proc/self/exe: the ELF header gives the section headers, the
// SHT_SYMTAB section the symbols, its linked string table their names. Only three kinds are
// kept: functions (to name the kernel from its address), thread-local variables whose name
// carries the ABI tag emu.h's __shared__ gives them ("B11kiln_shared"), and threadIdx (the point
// every offset is measured from).
#include "symbols.h"

#include <elf.h>
#include <link.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>

#include "emu.h"

namespace kiln::emu {
namespace {

// A symbol; file: for a local symbol, which object file it came from (the STT_FILE entry before
// it), so that two files' anonymous-namespace kernels of the same name stay apart; -1 if global.
struct Symbol {
    std::string name;
    std::uint64_t value = 0, size = 0;
    int file = -1;
};

// The tags emu.h's __shared__ and __global__ put into the names they declare.
const std::string kSharedTag = "B11kiln_shared", kKernelTag = "B11kiln_kernel";

struct SymbolTable {
    std::unordered_map<std::uint64_t, Symbol> functions;  // by address in the file
    std::vector<Symbol> function_statics;                 // the __shared__ arrays (tagged, thread-local)
    bool has_thread_idx = false;
    std::uint64_t thread_idx = 0;                         // threadIdx's offset in the TLS block
    std::uintptr_t load_bias = 0;                         // run-time address − address in the file
};

std::vector<char> read_at(std::ifstream& f, std::uint64_t offset, std::uint64_t bytes) {
    std::vector<char> out(bytes);
    f.seekg(static_cast<std::streamoff>(offset));
    f.read(out.data(), static_cast<std::streamsize>(bytes));
    if (!f) out.clear();
    return out;
}

// The main program is the first object dl_iterate_phdr reports; dlpi_addr is its load bias.
std::uintptr_t main_program_bias() {
    std::uintptr_t bias = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* out) {
            *static_cast<std::uintptr_t*>(out) = info->dlpi_addr;
            return 1;  // stop after the first
        },
        &bias);
    return bias;
}

SymbolTable read_symbols() {
    SymbolTable t;
    std::ifstream f("/proc/self/exe", std::ios::binary);
    Elf64_Ehdr eh{};
    if (!f.read(reinterpret_cast<char*>(&eh), sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr))
        return t;
    const std::vector<char> sh = read_at(f, eh.e_shoff, std::uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr));
    if (sh.empty()) return t;
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(sh.data());
    for (unsigned i = 0; i < eh.e_shnum; ++i) {
        if (sections[i].sh_type != SHT_SYMTAB || sections[i].sh_link >= eh.e_shnum) continue;
        const Elf64_Shdr &symtab = sections[i], &strtab = sections[symtab.sh_link];
        const std::vector<char> syms = read_at(f, symtab.sh_offset, symtab.sh_size);
        const std::vector<char> names = read_at(f, strtab.sh_offset, strtab.sh_size);
        if (syms.empty() || names.empty() || names.back() != '\0') return t;
        int file = -1;
        for (std::size_t k = 0; k < syms.size() / sizeof(Elf64_Sym); ++k) {
            const auto& s = reinterpret_cast<const Elf64_Sym*>(syms.data())[k];
            const int type = ELF64_ST_TYPE(s.st_info);
            if (type == STT_FILE) ++file;
            if (s.st_name >= names.size() || (type != STT_FUNC && type != STT_TLS)) continue;
            Symbol sym{names.data() + s.st_name, s.st_value, s.st_size,
                       ELF64_ST_BIND(s.st_info) == STB_LOCAL ? file : -1};
            if (type == STT_FUNC && s.st_value != 0) {
                t.functions.emplace(s.st_value, std::move(sym));
            } else if (type == STT_TLS && s.st_shndx != SHN_UNDEF) {
                if (sym.name == "threadIdx") t.has_thread_idx = true, t.thread_idx = s.st_value;
                // (not a guard variable, _ZGV..., which a static with a constructor has beside it)
                else if (sym.name.find(kSharedTag) != std::string::npos && sym.name.compare(0, 4, "_ZGV") != 0)
                    t.function_statics.push_back(std::move(sym));
            }
        }
    }
    t.load_bias = main_program_bias();
    return t;
}

// The declared name from the rest of a local-entity name: "2As" -> "As", "2As_0" -> "As" (the
// "_0" tells apart two statics of one name in a function).
std::string declared_name(const std::string& entity) {
    std::size_t digits = 0, length = 0;
    while (digits < entity.size() && entity[digits] >= '0' && entity[digits] <= '9')
        length = length * 10 + std::size_t(entity[digits++] - '0');
    if (digits == 0 || digits + length > entity.size()) return entity;
    return entity.substr(digits, length);
}

// The declared name of an array declared outside any kernel: "_ZZN4kiln4tile4loadEvE3bufB11kiln_shared"
// (a __device__ function's static, "_0" after it for a second one of the name) -> "buf": the
// <length><name> that ends right before the tag; the whole symbol if none does.
std::string device_array_name(const std::string& symbol) {
    const std::size_t tag = symbol.rfind(kSharedTag);
    for (std::size_t e = symbol.rfind('E', tag); e != std::string::npos && e > 0; e = symbol.rfind('E', e - 1)) {
        std::size_t digits = e + 1, length = 0;
        while (digits < tag && std::isdigit(static_cast<unsigned char>(symbol[digits])))
            length = length * 10 + std::size_t(symbol[digits++] - '0');
        if (digits > e + 1 && digits + length == tag) return symbol.substr(digits, length);
    }
    return symbol;
}

// The kernel's own arrays ("_ZZ" + its name without "_Z" + "E" + the array), then every array
// declared outside any kernel (in a __device__ function the kernel may call, or at namespace
// scope): their names carry no kernel's tag. Those are all checked at every launch: any kernel
// may use them, and kiln has few (none in its own kernels).
std::vector<StaticShared> find_arrays(const SymbolTable& t, const void* kernel) {
    std::vector<StaticShared> arrays, outside;  // the kernel's own; those declared outside any kernel
    if (!t.has_thread_idx) return arrays;  // a stripped program, or threadIdx not in the executable
    const auto fn = t.functions.find(reinterpret_cast<std::uintptr_t>(kernel) - t.load_bias);
    const bool named = fn != t.functions.end() && fn->second.name.compare(0, 2, "_Z") == 0;
    const std::string prefix = named ? "_ZZ" + fn->second.name.substr(2) + "E" : std::string();
    for (const Symbol& s : t.function_statics) {  // (in the symbol table's order, which the linker chooses)
        const auto at = static_cast<std::ptrdiff_t>(s.value - t.thread_idx);
        if (s.name.find(kKernelTag) == std::string::npos) {
            outside.push_back({at, s.size, device_array_name(s.name)});
        } else if (named && s.name.compare(0, prefix.size(), prefix) == 0) {
            if (fn->second.file >= 0 && s.file >= 0 && s.file != fn->second.file) continue;  // another file's
            arrays.push_back({at, s.size, declared_name(s.name.substr(prefix.size()))});
        }
    }
    arrays.insert(arrays.end(), outside.begin(), outside.end());
    return arrays;
}

}  // namespace

const std::vector<StaticShared>& static_shared_arrays(const void* kernel) {
    static std::mutex mutex;
    static std::map<const void*, std::vector<StaticShared>> by_kernel;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = by_kernel.find(kernel);
    if (it != by_kernel.end()) return it->second;
    static const SymbolTable table = read_symbols();
    return by_kernel.emplace(kernel, find_arrays(table, kernel)).first->second;
}

}  // namespace kiln::emu
