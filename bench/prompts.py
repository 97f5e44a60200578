"""The prompts `bench.generate` (and the GPU benchmarks built on it) complete: a system prompt and an instruction
shared by every request (a 44-token prefix) and 48 sentences to simplify, short and long. Data only."""

from __future__ import annotations

INSTRUCTION = (
    "Simplify this sentence for a young reader, then explain in two or three short sentences what you "
    "changed and why.\n\nSentence: "
)
SYSTEM = "You are a careful writing assistant."
SENTENCES = [
    ("Notwithstanding the considerable reservations expressed by several members of the committee, the proposal "
    "was ultimately adopted by a narrow majority."),
    ("The municipality, having conducted an exhaustive review of its procurement procedures, determined that the "
    "existing contracts were not in compliance with the newly enacted regulations."),
    "Photosynthesis is the process by which green plants convert light energy into chemical energy.",
    ("In the event that the aforementioned conditions are not satisfied within the stipulated period, the "
    "agreement shall be deemed null and void."),
    ("The patient's symptoms, which had initially been attributed to a benign viral infection, were subsequently "
    "found to be indicative of a more serious autoimmune disorder."),
    "Despite the fact that it was raining heavily, the children insisted on going outside to play.",
    ("The archaeological excavation uncovered a remarkably well-preserved collection of ceramic vessels, which "
    "researchers believe date from the late Bronze Age."),
    ("It is imperative that all employees familiarize themselves with the revised safety protocols prior to "
    "commencing operations."),
    "The committee postponed its decision.",
    ("Owing to unprecedented demand, the manufacturer has been compelled to implement a temporary allocation "
    "system for its most popular products."),
    ("Although the novel received widespread critical acclaim upon its publication, its commercial performance "
    "was considerably less impressive than its publisher had anticipated."),
    ("The governor vetoed the bill, citing concerns about its fiscal implications for the state's already "
    "strained budget."),
    ("Individuals who wish to participate in the study must provide written informed consent and demonstrate "
    "that they meet the eligibility criteria outlined in the protocol."),
    ("The river, swollen by weeks of incessant rainfall, eventually breached its banks and inundated the "
    "low-lying agricultural land."),
    ("Subsequent to the merger, the newly formed entity embarked upon a comprehensive restructuring of its "
    "operations, resulting in the elimination of numerous redundant positions."),
    "The physician prescribed a course of antibiotics.",
    ("Mitochondria, often described as the powerhouses of the cell, are responsible for generating the majority "
    "of the chemical energy required to power biochemical reactions."),
    ("The legislation, which was enacted in response to widespread public concern regarding data privacy, "
    "imposes stringent obligations on organizations that process personal information."),
    ("Her meticulous attention to detail, combined with an unwavering commitment to excellence, distinguished "
    "her from her contemporaries."),
    ("The expedition was abandoned when the team encountered impassable terrain and rapidly deteriorating "
    "weather conditions."),
    "Consumption of alcoholic beverages is strictly prohibited on the premises at all times.",
    ("The economist argued that the central bank's decision to raise interest rates would exacerbate rather "
    "than alleviate the prevailing economic downturn."),
    ("Upon arrival at the facility, visitors are required to present valid photographic identification and to "
    "sign the register maintained at the reception desk."),
    ("The cathedral, constructed over a period of nearly two centuries, exemplifies the transition from "
    "Romanesque to Gothic architectural styles."),
    "Volcanic eruptions can have profound and far-reaching consequences for global climate patterns.",
    ("The defendant maintained his innocence throughout the protracted legal proceedings, notwithstanding the "
    "substantial body of circumstantial evidence presented by the prosecution."),
    ("In order to mitigate the risk of further contamination, the authorities ordered the immediate evacuation "
    "of all residents within a two-kilometre radius."),
    "The orchestra performed the symphony with extraordinary precision and emotional depth.",
    ("Numerous studies have demonstrated a statistically significant correlation between regular physical "
    "exercise and improved cognitive function in older adults."),
    ("The company's quarterly earnings exceeded analysts' expectations, primarily as a consequence of robust "
    "sales in emerging markets."),
    ("Because the bridge had been deemed structurally unsound by independent engineers, the county closed it "
    "indefinitely pending extensive repairs."),
    ("The ambassador conveyed her government's profound regret regarding the incident and assured her "
    "counterparts that a thorough investigation would be undertaken."),
    "Glaciers are retreating at an accelerating rate.",
    ("Participants were randomly assigned to either the intervention group or the control group, and outcomes "
    "were assessed by investigators who were unaware of group allocation."),
    ("The manuscript, which had been presumed lost for several centuries, was discovered in the archives of a "
    "provincial monastery by a doctoral student conducting unrelated research."),
    "Children under the age of twelve must be accompanied by an adult at all times while on the premises.",
    ("The proliferation of misinformation on social media platforms has prompted calls for more rigorous "
    "content moderation policies."),
    ("Having exhausted all available avenues of appeal, the organization reluctantly accepted the tribunal's "
    "ruling and undertook to comply with its directives."),
    "The telescope enables astronomers to observe galaxies that are billions of light-years away.",
    ("The renovation of the historic theatre, which was financed through a combination of public grants and "
    "private donations, was completed ahead of schedule and under budget."),
    ("Insufficient hydration can precipitate a range of adverse physiological effects, including fatigue, "
    "headaches and impaired concentration."),
    ("The board of directors unanimously endorsed the chief executive's strategic plan for expansion into the "
    "Asian market."),
    ("Residents expressed vehement opposition to the proposed construction of a waste incineration plant in "
    "close proximity to the primary school."),
    ("The migratory patterns of numerous avian species have been significantly altered as a result of changes "
    "in temperature and precipitation."),
    "Applicants are advised that incomplete submissions will not be considered.",
    ("The philosopher contended that moral obligations derive not from divine command but from the rational "
    "nature of human beings."),
    ("Following the discovery of significant irregularities in the financial statements, the auditors declined "
    "to issue an unqualified opinion."),
    ("The vaccine was developed in record time owing to unprecedented international collaboration and "
    "substantial public investment."),
]
