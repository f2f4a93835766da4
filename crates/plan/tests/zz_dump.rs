use weir_proto::prost::Message;
use weir_plan::*;
use weir_model::Coder;
fn c(x: &Coder) -> String { match x {
  Coder::Opaque{urn, components, ..} => format!("{}[{}]", urn.replace("beam:coder:","").replace(":v1",""), components.iter().map(c).collect::<Vec<_>>().join(",")),
  Coder::Kv(a,b) => format!("KV({},{})", c(a), c(b)),
  Coder::Iterable(a) => format!("It({})", c(a)),
  Coder::LengthPrefix(a) => format!("LP({})", c(a)),
  Coder::Nullable(a) => format!("Null({})", c(a)),
  o => format!("{o:?}") } }
#[test]
fn dump() {
    for name in ["wordcount","side_input","multimap_side_input","flatten_mixed_coders","flatten_then_gbk","stateful_dofn","after_count_trigger","sessions","unknown_urn"] {
        let bytes = std::fs::read(format!("{}/tests/fixtures/{name}.pb", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let p = weir_proto::beam::Pipeline::decode(bytes.as_slice()).unwrap();
        println!("===== {name}");
        match plan(&p, &PlanOptions{fn_api_url: "localhost:1".into()}) {
            Err(e) => println!("ERR {e:?}\n  {e}"),
            Ok(pl) => {
                for (i, pc) in pl.graph.pcollections.iter().enumerate() { println!("  pc{i} {} {} {:?} {:?}", pc.id, c(&pc.value_coder), pc.window_coder, pc.windowing); }
                for s in &pl.graph.stages { println!("  {} [{}] {:?}", s.id, s.name, s.kind); 
                  if let Some(d) = pl.descriptors.get(&s.id) { let mut k: Vec<_> = d.transforms.iter().map(|(k,t)| format!("{k} => {}", t.spec.as_ref().unwrap().urn)).collect(); k.sort(); for x in k { println!("      {x}"); } }
                }
            }
        }
    }
}
